"""Ledger + index behaviour: add, duplicates, supersede chain, forget, persistence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, MemoryStore
from loopstack.memory.exceptions import IndexMismatchError, NotFoundError, RedactedError, ScopeError
from tests.unit.memory.conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The contract: every test here that uses ``store`` runs on SQLite and on Postgres."""
    return str(request.param)


async def test_add_and_recall_roundtrip(store: AsyncMemoryStore) -> None:
    rid = await store.add("The staging database runs on port 5433", user_id="u1")
    rec = await store.recall("which port does the staging database use", user_id="u1")
    assert [c.id for c in rec.items] == [rid]
    assert rec.items[0].score > 0
    assert "- [fact | " in rec.block and "port 5433" in rec.block
    assert rec.block.startswith("<memory>") and rec.block.endswith("</memory>")


async def test_duplicate_returns_existing_id_and_counts_mentions(store: AsyncMemoryStore) -> None:
    a = await store.add("I prefer tabs over spaces", user_id="u1", type="preference")
    b = await store.add("i prefer TABS over spaces!", user_id="u1", type="preference")
    assert a == b
    rec = await store.get(a, user_id="u1")
    assert rec.mentions == 2
    same = await store.add_many(["alpha beta gamma", "Alpha, beta gamma."], user_id="u1")
    assert same[0] == same[1]  # duplicates inside one batch collapse too
    assert await store.add("alpha beta gamma", user_id="u1") == same[0]


async def test_supersede_chain_and_history(store: AsyncMemoryStore) -> None:
    old = await store.add("The team standup is at 9am every day", user_id="u1")
    new = await store.add("The team standup is at 10am every day", user_id="u1")
    assert new != old
    old_rec = await store.get(old, user_id="u1")
    assert old_rec.superseded_by == new
    chain = await store.history(old, user_id="u1")
    assert [r.id for r in chain] == [old, new]
    assert [r.id for r in await store.history(new, user_id="u1")] == [old, new]
    rec = await store.recall("when is the team standup", user_id="u1")
    assert [c.id for c in rec.candidates] == [new]  # superseded never comes back
    listed = await store.list(user_id="u1", include_superseded=True)
    assert {r.id for r in listed} == {old, new}


async def test_explicit_supersedes(store: AsyncMemoryStore) -> None:
    a = await store.add("Project codename is Falcon", user_id="u1")
    b = await store.add("We renamed it: Osprey", user_id="u1", supersedes=a)
    assert (await store.get(a, user_id="u1")).superseded_by == b
    with pytest.raises(NotFoundError):
        await store.add("something else entirely", user_id="u2", supersedes=b)


async def test_forget_reaches_ledger_and_index(store: AsyncMemoryStore) -> None:
    keep = await store.add("My dog is called Rex", user_id="u1")
    a = await store.add("My bank is called Northbank", user_id="u1")
    b = await store.add("My bank is called Southbank", user_id="u1", supersedes=a)
    gone = await store.forget(b, user_id="u1")
    assert set(gone) == {a, b}  # the older version it replaced goes too
    assert len(store.index) == 1
    rec = await store.recall("what is my bank called", user_id="u1", threshold=-10)
    assert all(c.id == keep for c in rec.candidates)
    # a tombstone keeps the chain (issue #44): history shows it, without the text
    assert [r.text for r in await store.history(b, user_id="u1")] == ["[forgotten]"] * 2


async def test_forget_other_users_record_is_refused(store: AsyncMemoryStore) -> None:
    rid = await store.add("secret plan alpha", user_id="alice")
    with pytest.raises(NotFoundError):
        await store.forget(rid, user_id="mallory")
    assert (await store.get(rid, user_id="alice")).text == "secret plan alpha"


async def test_scope_required(store: AsyncMemoryStore) -> None:
    with pytest.raises(ScopeError):
        await store.add("x y z", user_id="")
    with pytest.raises(ScopeError):
        await store.recall("x", user_id="  ")


async def test_only_a_secret_is_rejected(store: AsyncMemoryStore) -> None:
    with pytest.raises(RedactedError):
        await store.add("4111 1111 1111 1111", user_id="u1")
    assert await store.list(user_id="u1") == []


async def test_stale_index_catches_up_on_open(tmp_path: Path, settings: MemorySettings) -> None:
    path = tmp_path / "m.db"
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    ids = await st.add_many(
        [f"note number {i} about topic {i % 7}" for i in range(120)],
        user_id="u1",
        check_conflicts=False,
    )
    await st.close()
    snapshot = tmp_path / "snap"
    shutil.copytree(st.index_dir, snapshot)  # index as of 120 records
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    more = await st.add_many(
        [f"later note {i} on subject {i}" for i in range(30)], user_id="u1", check_conflicts=False
    )
    await st.forget(ids[0], user_id="u1")
    await st.close()
    shutil.rmtree(st.index_dir)
    shutil.copytree(snapshot, st.index_dir)  # put the stale index back
    st = AsyncMemoryStore(path, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    assert len(st.index) == 149
    hits = st.index.search(
        next(iter(st.index.shards)),
        (await st.embedder.embed(["later note 3 on subject 3"]))[0][None, :],
        1,
    )
    got = await st.get(more[3], user_id="u1")
    assert hits[0][0] == got.rowid
    await st.close()


async def test_reindex_rebuilds_from_ledger(store: AsyncMemoryStore) -> None:
    await store.add_many([f"fact {i} about item{i}" for i in range(40)], user_id="u1")
    await store.add_many([f"fact {i} about thing{i}" for i in range(10)], user_id="u2")
    shutil.rmtree(store.index_dir)
    out = await store.reindex()
    assert out["vectors"] == 50 and out["shards"] == 2
    rec = await store.recall("item7", user_id="u1")
    assert rec.items and "item7" in rec.items[0].text


async def test_hnsw_shard_with_tombstones(tmp_path: Path) -> None:
    s = MemorySettings(hnsw_threshold=60, threshold=0.3, persist_every=10)
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    ids = await st.add_many(
        [f"entry {i} codeword{i} region{i % 5}" for i in range(100)],
        user_id="u1",
        check_conflicts=False,
    )
    stats = await st.stats()
    assert stats["hnsw_shards"] == 1
    await st.forget(ids[42], user_id="u1")
    rec = await st.recall("codeword42", user_id="u1", threshold=-10)
    assert ids[42] not in {c.id for c in rec.candidates}
    await st.close()
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    rec = await st.recall("codeword43", user_id="u1")
    assert rec.items[0].id == ids[43]
    assert ids[42] not in {c.id for c in rec.candidates}
    await st.close()


async def test_embedder_change_is_detected(tmp_path: Path) -> None:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(dim=64))
    await st.add("hello there world", user_id="u1")
    await st.close()
    other = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(dim=128))
    with pytest.raises(IndexMismatchError):
        await other.open()
    out = await other.reindex(reembed=True)
    assert out["vectors"] == 1
    await other.close()


def test_sync_wrapper_from_plain_code(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "s.db", embedder=HashingEmbedder()) as st:
        rid = st.add("The office wifi is called loopnet", user_id="u1")
        ids = st.add_many(["Lunch is at noon on weekdays"], user_id="u1")
        rec = st.recall("wifi name", user_id="u1", threshold=0.2)
        assert rec.items[0].id == rid and rec.block
        assert st.history(rid, user_id="u1")[0].id == rid
        assert st.forget(ids[0], user_id="u1") == ids
        assert st.stats()["active"] == 1


async def test_sync_wrapper_inside_running_loop(tmp_path: Path) -> None:
    st = MemoryStore(tmp_path / "s.db", embedder=HashingEmbedder())
    rid = st.add("works inside an event loop", user_id="u1")  # would fail with asyncio.run
    assert st.get(rid, user_id="u1").text == "works inside an event loop"
    st.close()


def test_path_with_tilde_and_default_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LOOPSTACK_HOME", str(tmp_path / "lh"))
    with MemoryStore("~/m/x.db", embedder=HashingEmbedder()) as st:
        st.add("tilde paths are expanded", user_id="u1")
    assert (tmp_path / "m" / "x.db").exists()
    with MemoryStore(embedder=HashingEmbedder()) as st:
        assert st.path == tmp_path / "lh" / "memory" / "memory.db"
        st.add("default location under LOOPSTACK_HOME", user_id="u1")
    assert (tmp_path / "lh" / "memory" / "memory.db").exists()
