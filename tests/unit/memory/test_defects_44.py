"""Issue #44, the memory half: forget by the hybrid score, forget keeps a tombstone, decay
(scheduled, counted honestly, a floor for what the user said, ``--now``) and write-back
reporting its supersede. Real SQLite + FAISS with the hashing embedder; each test failed on
the code before its fix (the report of #44 lists the messages)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, Turn
from loopstack.memory.cli import app
from tests.unit.memory.conftest import BACKENDS

DAY = 86_400.0


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The store-based tests run on the SQLite and on the Postgres ledger."""
    return str(request.param)


async def test_7_forget_matching_uses_the_hybrid_score(store: AsyncMemoryStore) -> None:
    sister = await store.add("My sister lives in Porto", user_id="u1")
    brother = await store.add("My brother lives in Lisbon", user_id="u1")
    standup = await store.add("Standup is at 10am", user_id="u1")
    gone = await store.forget_matching("sister", user_id="u1")
    assert gone == [sister], gone
    left = {r.id for r in await store.list(user_id="u1")}
    assert left == {brother, standup}


async def test_8_forget_keeps_a_tombstone_history_can_show(store: AsyncMemoryStore) -> None:
    a = await store.add("My bank is called Northbank", user_id="u1")
    b = await store.add("My bank is called Southbank", user_id="u1", supersedes=a)
    assert set(await store.forget(b, user_id="u1")) == {a, b}
    chain = await store.history(b, user_id="u1")  # was NotFoundError
    assert [r.id for r in chain] == [a, b]
    assert all("bank" not in r.text.lower() for r in chain)  # the content is gone
    assert chain[0].superseded_by == b  # the supersede chain is kept
    assert any(e.kind == "forgotten" for e in chain[-1].events)
    assert all("Northbank" not in e.detail for r in chain for e in r.events)
    assert await store.list(user_id="u1") == []
    rec = await store.recall("what is my bank called", user_id="u1", threshold=-10)
    assert rec.candidates == []
    assert len(store.index) == 0


async def test_9_decay_counts_changed_rows_floors_explicit_and_runs_when_due(
    tmp_path: Path, settings: MemorySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    path = tmp_path / "m.db"
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    decade = now - 3650 * DAY
    said = await st.add("User's name is Dana", user_id="u1", created_at=decade)
    faint = await st.add("User's locker is 12", user_id="u1", weight=0.01, created_at=decade)
    guess = await st.add("User likes jazz", user_id="u1", source="inferred", created_at=decade)
    mid = await st.add(
        "User plays chess", user_id="u1", source="inferred", created_at=now - 90 * DAY
    )
    fresh = await st.add("User is reviewing the Q3 budget", user_id="u1", source="inferred")
    assert st.ledger.get_meta("decayed_at") is None  # a new store: nothing ran on open
    out = await st.decay(now=now)
    # honest count: the rows whose weight moved (not the fresh one, nor one under the floor)
    assert out == {"decayed": 3, "pruned": 1}, out
    floor = settings.explicit_weight_floor
    assert (await st.get(said, user_id="u1")).weight == pytest.approx(floor)  # the floor
    assert (await st.get(faint, user_id="u1")).weight == pytest.approx(0.01)  # never raised
    assert {r.id for r in await st.list(user_id="u1")} == {said, faint, mid, fresh}  # kept
    assert guess not in {r.id for r in await st.list(user_id="u1")}
    assert await st.decay(now=now + 1) == {"decayed": 0, "pruned": 0}  # a re-run: nothing
    assert float(st.ledger.get_meta("decayed_at") or 0) == pytest.approx(now + 1)
    # scheduled: a store opened when a run is due decays by itself (and records when)
    st.ledger.set_meta("decayed_at", repr(now - 400 * DAY))
    before = (await st.get(mid, user_id="u1")).weight
    await st.close()
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    assert (await st.get(mid, user_id="u1")).weight < before
    assert float(st.ledger.get_meta("decayed_at") or 0) >= now
    # not due: opening again changes nothing
    before = (await st.get(mid, user_id="u1")).weight
    await st.close()
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    assert (await st.get(mid, user_id="u1")).weight == pytest.approx(before)
    await st.close()
    # the CLI takes --now
    monkeypatch.setenv("LOOPSTACK_MEMORY_EMBEDDER", "hashing")
    later = now + 2000 * DAY
    res = CliRunner().invoke(app, ["decay", "--db", str(path), "--now", str(later)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["decayed"] >= 1


async def test_9_write_back_reports_its_supersede(store: AsyncMemoryStore) -> None:
    old = await store.add("My sister lives in Lisbon", user_id="u1")
    results = await store.write_back(
        Turn(user_message="Remember that my sister lives in Porto"), user_id="u1"
    )
    stored = [r for r in results if r.id is not None]
    assert [(r.action, r.superseded) for r in stored] == [("superseded", old)], results
    assert (await store.get(old, user_id="u1")).superseded_by == stored[0].id


async def test_9_decay_is_counted_honestly_on_both_ledgers(store: AsyncMemoryStore) -> None:
    now = time.time()
    said = await store.add("User's name is Dana", user_id="u1", created_at=now - 3650 * DAY)
    await store.add("User plays chess", user_id="u1", source="inferred", created_at=now - 9 * DAY)
    await store.add("User likes jazz", user_id="u1", source="inferred", created_at=now - 3650 * DAY)
    assert await store.decay(now=now) == {"decayed": 3, "pruned": 1}
    assert await store.decay(now=now + 1) == {"decayed": 0, "pruned": 0}
    floor = store.settings.explicit_weight_floor
    assert (await store.get(said, user_id="u1")).weight == pytest.approx(floor)


async def test_9_a_long_running_store_decays_after_write_back_when_due(
    tmp_path: Path, settings: MemorySettings
) -> None:
    every = settings.model_copy(update={"decay_every_hours": 0.3 / 3600})  # 0.3 s
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=every)
    now = time.time()
    old = await st.add(
        "User plays chess", user_id="u1", source="inferred", created_at=now - 90 * DAY
    )
    await asyncio.sleep(0.4)
    await st.write_back(Turn(user_message="hello"), user_id="u1")  # no open in between
    assert st.ledger.get_meta("decayed_at") is not None
    assert (await st.get(old, user_id="u1")).weight == pytest.approx(0.5**0.5, rel=1e-3)
    await st.close()
