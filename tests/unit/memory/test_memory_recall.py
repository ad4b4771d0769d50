"""The four gates: threshold, budget packing, scoring parts, hybrid merge, isolation."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.pipeline import (
    BLOCK_FOOTER,
    BLOCK_HEADER,
    estimate_tokens,
    freshness,
    pack,
    query_terms,
    render_line,
    score_candidates,
    stem_terms,
)
from loopstack.memory.records import Candidate, MemorySource, MemoryType, Record, Scope
from tests.unit.memory.conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The contract: every test here that uses ``store`` runs on SQLite and on Postgres."""
    return str(request.param)


def _rec(text: str, **kw: object) -> Record:
    return Record(id=f"id-{abs(hash(text))}", scope=Scope("u"), text=text, **kw)  # type: ignore[arg-type]


async def test_irrelevant_query_injects_nothing(store: AsyncMemoryStore) -> None:
    await store.add_many(
        ["The deploy pipeline runs on Fridays", "User prefers dark mode in the editor"],
        user_id="u1",
    )
    rec = await store.recall("recipe for banana bread", user_id="u1")
    assert rec.items == [] and rec.block == "" and rec.tokens == 0
    assert rec.candidates and all(not c.kept for c in rec.candidates)
    assert all("below threshold" in c.reason for c in rec.candidates)


async def test_threshold_is_a_real_cut(store: AsyncMemoryStore) -> None:
    await store.add("User prefers dark mode in the editor", user_id="u1", type="preference")
    q = "does the user like dark mode in the editor"
    rec = await store.recall(q, user_id="u1")
    assert rec.items
    score = rec.items[0].score
    assert (await store.recall(q, user_id="u1", threshold=score + 1e-6)).items == []
    assert (await store.recall(q, user_id="u1", threshold=score - 1e-6)).items


def test_pack_skips_what_does_not_fit_and_never_truncates() -> None:
    long = _rec("alpha " * 120)  # ~180 tokens
    short = _rec("alpha beta short fact")
    cands = [
        Candidate(record=long, score=0.9, kept=True),
        Candidate(record=short, score=0.5, kept=True),
    ]
    for c in cands:
        c.tokens = estimate_tokens(render_line(c.record))
    budget = estimate_tokens(BLOCK_HEADER) + estimate_tokens(BLOCK_FOOTER) + cands[1].tokens + 5
    kept, block, used = pack(cands, budget, max_items=10)
    assert [c.record.id for c in kept] == [short.id]
    assert "does not fit budget" in cands[0].reason and not cands[0].kept
    assert render_line(short) in block.splitlines()  # whole line, not cut
    assert "alpha alpha alpha" not in block
    assert used <= budget
    # With room for both, both go in, each line whole.
    for c in cands:
        c.kept = True
    kept, block, used = pack(cands, 10_000, max_items=10)
    assert {c.record.id for c in kept} == {long.id, short.id}
    assert render_line(long) in block.splitlines()


async def test_budget_through_the_store(store: AsyncMemoryStore) -> None:
    big = "Release checklist: " + " ".join(f"step{i} release" for i in range(150))
    await store.add(big, user_id="u1", type="procedure")
    await store.add("Release day is Thursday", user_id="u1")
    rec = await store.recall("release", user_id="u1", budget_tokens=80)
    texts = [c.text for c in rec.items]
    assert texts == ["Release day is Thursday"]
    assert rec.tokens <= 80
    assert any("does not fit" in c.reason for c in rec.candidates if c.text == big)


def test_block_format_and_order() -> None:
    old = _rec("User lives in Berlin", created_at=1_700_000_000.0)
    new = _rec("User moved to Paris", created_at=1_780_000_000.0, type=MemoryType.EPISODE)
    cands = [
        Candidate(record=new, score=0.9, kept=True),
        Candidate(record=old, score=0.8, kept=True),
    ]
    for c in cands:
        c.tokens = estimate_tokens(render_line(c.record))
    _kept, block, _ = pack(cands, 1000, max_items=5)
    lines = block.splitlines()
    assert lines[0] == "<memory>" and lines[-1] == "</memory>"
    assert "Newer wins on conflict" in block and "current words win" in block
    assert lines[-3] == "- [fact | 2023-11-14 | user said] User lives in Berlin"
    assert lines[-2] == "- [episode | 2026-05-28 | user said] User moved to Paris"


def test_scoring_parts() -> None:
    s = MemorySettings()
    now = 1_800_000_000.0
    fresh = _rec("a", created_at=now, source=MemorySource.USER_EXPLICIT, weight=2.0, hits=10)
    stale = _rec("b", created_at=now - 365 * 86400, source=MemorySource.INFERRED, weight=0.3)
    assert freshness(fresh, now, 90) == 1.0
    assert freshness(stale, now, 90) == pytest.approx(0.5 ** (365 / 90))
    cands = [Candidate(record=stale, similarity=0.6), Candidate(record=fresh, similarity=0.6)]
    out = score_candidates(cands, s, now=now, task_type=MemoryType.FACT)
    assert out[0].record is fresh and out[0].importance > out[1].importance
    assert out[0].type_boost == s.type_boost


def test_query_terms_and_stems() -> None:
    assert query_terms("What did I say about the Kubernetes upgrades?") == [
        "say",
        "kubernetes",
        "upgrades",
    ]
    assert stem_terms(["upgrades", "running"]) == {"upgrades": "upgrad", "running": "run"}


async def test_keyword_gate_finds_rare_tokens(store: AsyncMemoryStore) -> None:
    rid = await store.add("Ticket ZX-4471 is blocked on legal review", user_id="u1")
    await store.add_many([f"generic note {i} on planning" for i in range(20)], user_id="u1")
    kw = await store.recall("ZX-4471", user_id="u1", mode="keyword", threshold=-10)
    assert kw.candidates[0].id == rid and "keyword" in kw.candidates[0].via
    hy = await store.recall("status of ZX-4471", user_id="u1")
    assert hy.items[0].id == rid


async def test_agent_and_session_scope(store: AsyncMemoryStore) -> None:
    a = await store.add("coder agent uses ruff for linting", user_id="u1", agent_id="coder")
    b = await store.add("writer agent uses vale for linting", user_id="u1", agent_id="writer")
    c = await store.add("linting must pass before merge", user_id="u1")
    rec = await store.recall("linting", user_id="u1", agent_id="coder", threshold=-10)
    ids = {x.id for x in rec.candidates}
    assert a in ids and c in ids and b not in ids


async def test_usage_updates_hits(store: AsyncMemoryStore) -> None:
    rid = await store.add("The VPN gateway is vpn2.example.org", user_id="u1")
    for _ in range(3):
        assert (await store.recall("vpn gateway", user_id="u1")).items
    await store.add("unrelated write flushes usage", user_id="u1")
    got = await store.get(rid, user_id="u1")
    assert got.hits == 3 and got.last_used_at is not None


@pytest.mark.slow
async def test_no_cross_user_results_in_10k_random_queries(tmp_path: Path) -> None:
    """Randomised isolation check: 50 users share one vocabulary (so their records look
    alike), 10,000 queries drawn from everyone's texts; no result may belong to anyone but
    the asking user. Uses the hashing embedder to stay fast."""
    rng = random.Random(1234)
    vocab = [f"w{i}" for i in range(300)]
    st = AsyncMemoryStore(
        tmp_path / "iso.db", embedder=HashingEmbedder(), settings=MemorySettings(threshold=-1.0)
    )
    owner: dict[str, str] = {}
    users = [f"user{i}" for i in range(50)]
    all_texts: list[str] = []
    for u in users:
        texts = [" ".join(rng.choices(vocab, k=8)) + f" n{rng.random()}" for _ in range(40)]
        ids = await st.add_many(texts, user_id=u, check_conflicts=False)
        owner.update(dict.fromkeys(ids, u))
        all_texts += texts
    t0 = time.perf_counter()
    checked = 0
    for _ in range(10_000):
        u = rng.choice(users)
        q = rng.choice(all_texts) if rng.random() < 0.7 else " ".join(rng.choices(vocab, k=4))
        rec = await st.recall(q, user_id=u, budget_tokens=2000)
        for c in rec.candidates:
            assert owner[c.id] == u, f"{u} got {owner[c.id]}'s record {c.id}"
            checked += 1
        assert all(owner[c.id] == u for c in rec.items)
    assert checked > 100_000  # the test really looked at many candidates
    assert time.perf_counter() - t0 < 120
    await st.close()


def test_prune_terms_keeps_rarest_within_budget() -> None:
    from loopstack.memory.pipeline import prune_terms

    df = {"common": 900, "rare": 3, "mid": 150, "huge": 60_000}
    stems = {t: t for t in df}
    terms = ["common", "rare", "mid", "huge"]
    assert prune_terms(terms, df, stems, 100_000, 0.05, 2_500) == ["common", "rare", "mid"]
    assert prune_terms(terms, df, stems, 100_000, 0.05, 200) == ["rare", "mid"]
    assert prune_terms(["huge"], df, stems, 100_000, 0.05, 2_500) == []
    assert prune_terms(["common"], df, stems, 100_000, 0.05, 500) == []
