"""Provenance, the trust floor, the verification path and the supersede rule."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, Turn
from loopstack.memory.writeback import conflicting_value
from tests.unit.memory.conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The contract: every test here that uses ``store`` runs on SQLite and on Postgres."""
    return str(request.param)


CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Dakar"]


@pytest.mark.parametrize(
    ("old", "new", "conflict"),
    [
        ("My sister lives in Paris", "My sister lives in Tokyo", True),
        ("Standup is at 9am", "Standup is at 10am", True),
        ("The user prefers dark mode", "The user prefers light mode", True),
        ("I eat meat", "I don't eat meat", True),
        ("My sister lives in Paris", "My sister lives in Paris now", False),  # addition
        ("User prefers metric units", "Standup is at 10am", False),
        ("I work at Acme", "I live in Berlin", False),
        ("My sister lives in Paris", "My brother lives in Rome and plays chess", False),
        ("The team uses Jenkins", "The team uses Jenkins", False),
    ],
)
def test_conflicting_value_rule(old: str, new: str, conflict: bool) -> None:
    assert conflicting_value(old, new) is conflict


async def test_sister_facts_chain_consistently(store: AsyncMemoryStore) -> None:
    ids = [await store.add(f"My sister lives in {c}", user_id="u1") for c in CITIES]
    assert len(set(ids)) == len(CITIES)
    active = await store.list(user_id="u1")
    assert [r.id for r in active] == [ids[-1]]  # each one superseded the one before
    chain = await store.history(ids[0], user_id="u1")
    assert [r.id for r in chain] == ids
    assert all(r.events[-1].kind == "contradicted" for r in chain[:-1])
    rec = await store.recall("where does my sister live", user_id="u1")
    assert [c.text for c in rec.items] == ["My sister lives in Dakar"]


async def test_explicit_add_can_turn_superseding_off(store: AsyncMemoryStore) -> None:
    ids = [
        await store.add(f"My sister lives in {c}", user_id="u1", on_conflict="keep") for c in CITIES
    ]
    assert {r.id for r in await store.list(user_id="u1")} == set(ids)


async def test_batch_supersede_matches_sequential(store: AsyncMemoryStore) -> None:
    ids = await store.add_many([f"My sister lives in {c}" for c in CITIES], user_id="u1")
    assert [r.id for r in await store.list(user_id="u1")] == [ids[-1]]


async def test_batch_decides_on_what_its_earlier_items_changed(store: AsyncMemoryStore) -> None:
    """A restatement earlier in the batch promotes the record (3 mentions: "repeated"), so a
    later unverified claim of the same batch may not supersede it (read back, not cached)."""
    first = await store.add("My sister lives in Paris", user_id="u1", source="inferred")
    await store.add("My sister lives in Paris", user_id="u1", source="inferred")
    ids = await store.add_many(
        ["My sister lives in Paris", "My sister lives in Tokyo"], user_id="u1", source="inferred"
    )
    assert ids[0] == first
    rec = await store.get(first, user_id="u1")
    assert rec.mentions == 3 and rec.superseded_by is None
    assert rec.events[-1].kind == "conflict_kept"
    assert {r.id for r in await store.list(user_id="u1")} == {first, ids[1]}


async def test_block_says_how_each_entry_is_known(store: AsyncMemoryStore) -> None:
    await store.add("The build server is called hopper", user_id="u1")
    await store.add(
        "The build server runs Ubuntu 24.04",
        user_id="u1",
        source="task",
        confidence=0.8,
        evidence=["tool:uname#3"],
    )
    await store.add("The build server has 64 cores", user_id="u1", source="task", confidence=0.4)
    rec = await store.recall("build server", user_id="u1", threshold=-math.inf)
    lines = rec.block.splitlines()
    assert any(ln.endswith("| user said] The build server is called hopper") for ln in lines)
    assert any("| evidence: tool:uname#3] The build server runs Ubuntu" in ln for ln in lines)
    assert not any("64 cores" in ln for ln in lines)  # below the trust floor
    kinds = {c.text: c.provenance for c in rec.candidates}
    assert kinds["The build server has 64 cores"] == "unverified"
    dropped = next(c for c in rec.candidates if "64 cores" in c.text)
    assert "below floor" in dropped.reason
    rec = await store.recall(
        "build server", user_id="u1", threshold=-math.inf, include_unverified=True
    )
    assert "| unverified] The build server has 64 cores" in rec.block
    assert len(await store.list(user_id="u1")) == 3  # it stays in the ledger


async def test_repetition_is_a_provenance(store: AsyncMemoryStore) -> None:
    for _ in range(3):
        res = await store.write_back(Turn(user_message="I work at Globex in Lisbon"), user_id="u1")
    assert res[0].action == "promoted"
    rec = await store.recall("where do I work", user_id="u1", threshold=-math.inf)
    assert rec.items[0].provenance == "repeated"
    assert "| repeated 3x] I work at Globex in Lisbon" in rec.block


async def test_unverified_never_outranks_verified(store: AsyncMemoryStore) -> None:
    good = await store.add(
        "Customer tier is silver",
        user_id="u1",
        evidence=["tool:crm#1"],
        source="task",
        confidence=0.8,
    )
    bad = await store.add(
        "Customer tier is unlimited platinum",
        user_id="u1",
        source="task",
        confidence=0.4,
    )
    assert (await store.get(good, user_id="u1")).superseded_by is None  # not replaced
    good_rec = await store.get(good, user_id="u1")
    assert good_rec.events and good_rec.events[-1].kind == "conflict_kept"
    # the poisoned text is the query itself: as relevant as it can get
    rec = await store.recall(
        "Customer tier is unlimited platinum",
        user_id="u1",
        include_unverified=True,
        threshold=-math.inf,
    )
    order = [c.id for c in rec.candidates]
    assert order.index(good) < order.index(bad)


async def test_user_confirmation_and_contradiction_are_history(store: AsyncMemoryStore) -> None:
    rid = await store.add(
        "The office moved to Dock Street", user_id="u1", source="task", confidence=0.5
    )
    assert (await store.recall("office", user_id="u1", threshold=-math.inf)).items == []
    rec = await store.verify(rid, user_id="u1", by_user=True)
    assert rec.events[-1].kind == "confirmed" and "the user" in rec.events[-1].detail
    got = await store.recall("office", user_id="u1", threshold=-math.inf)
    assert got.items[0].provenance == "user_said" and "| user confirmed]" in got.block
    new = await store.add("The office moved to Pier Street", user_id="u1")
    hist = await store.history(rid, user_id="u1")
    assert [r.id for r in hist] == [rid, new]
    assert [e.kind for e in hist[0].events] == ["confirmed", "contradicted"]
    with pytest.raises(Exception, match="no record"):
        await store.history(rid, user_id="u2")  # scoped


async def test_two_stores_on_one_file_do_not_duplicate(tmp_path: Path) -> None:
    """Duplicate decisions are taken inside the write transaction: two stores (as two
    processes would) adding the same texts at once still keep one active record each."""
    s = MemorySettings(threshold=0.3, supersede_similarity=0.7)
    a = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    b = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    await a.open()
    await b.open()
    texts = [f"alpha{i} bravo{i} charlie{i} delta{i} echo{i}" for i in range(20)]
    ra, rb = await asyncio.gather(
        asyncio.gather(*(a.add(t, user_id="u1") for t in texts)),
        asyncio.gather(*(b.add(t, user_id="u1") for t in texts)),
    )
    assert ra == rb
    assert len(await a.list(user_id="u1", limit=100)) == len(texts)
    await a.close()
    await b.close()


async def test_keyword_statistics_are_per_user(tmp_path: Path) -> None:
    s = MemorySettings(threshold=0.3, keyword_min_df_records=1, keyword_max_df=0.5)
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    await st.open()
    # user "big" says "zebra" everywhere; that must not change what user "small" gets.
    await st.add_many(
        [f"zebra stripes note {i}" for i in range(40)], user_id="big", check_conflicts=False
    )
    await st.add_many(
        ["The zebra crossing is on Elm Street", "Lunch is at noon"],
        user_id="small",
        check_conflicts=False,
    )
    assert st.ledger.doc_freq("small", ["zebra"]) == {"zebra": 1}
    assert st.ledger.doc_freq("big", ["zebra"]) == {"zebra": 40}
    rec = await st.recall("zebra", user_id="small", mode="keyword", threshold=-math.inf)
    assert [c.text for c in rec.candidates] == ["The zebra crossing is on Elm Street"]
    await st.forget(rec.candidates[0].id, user_id="small")
    assert st.ledger.doc_freq("small", ["zebra"]) == {"zebra": 0}
    await st.close()


async def test_supersede_sees_the_other_writers_latest_commit(tmp_path: Path) -> None:
    """Store ``a``'s index has not seen ``b``'s newest version when ``a`` writes again: the
    decision is still taken on the committed state (inside the write transaction)."""
    s = MemorySettings(threshold=0.3, supersede_similarity=0.4)
    a = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    b = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=s)
    await a.open()
    await b.open()
    first = await a.add("Project alpha status is red", user_id="u1")
    second = await b.add("Project alpha status is green", user_id="u1")
    third = await a.add("Project alpha status is blocked", user_id="u1")
    assert [r.id for r in await a.list(user_id="u1")] == [third]
    assert [r.id for r in await a.history(third, user_id="u1")] == [first, second, third]
    await a.close()
    await b.close()
