"""Keyword recall on Postgres under row-level security: it reads the postings of the query's
lexemes, not every record of the user (``tsv @@ q`` is not LEAKPROOF, so a GIN index on
``tsv`` cannot be used under the policies: the ledger goes through the ``postings`` btree)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.ledger.postgres import PostgresLedger
from loopstack.memory.ledger.postgres_schema import SET_SCOPE
from loopstack.memory.records import Scope
from tests.unit.memory.ledger_history import PG_V1


def _records_read(plan: dict[str, Any]) -> int:
    """Rows the plan took from ``records`` (kept or filtered out), over all loops."""
    n = 0
    if plan.get("Relation Name") == "records":
        per_loop = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        n += per_loop * plan.get("Actual Loops", 1)
    return n + sum(_records_read(p) for p in plan.get("Plans", []))


def _explained_keyword(ledger: PostgresLedger, scope: Scope, terms: list[str]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of exactly the SQL ``ledger.keyword`` runs, under the same scope."""
    seen: list[tuple[str, Any, str, dict[str, Any]]] = []
    real = ledger._rows

    def capture(sql: str, params: Any = (), scope_: str = "*", **kw: Any) -> list[Any]:
        seen.append((sql, params, scope_, kw))
        return real(sql, params, scope_, **kw)

    ledger._rows = capture  # type: ignore[method-assign,assignment]
    try:
        hits = ledger.keyword(scope, terms, 24)
    finally:
        del ledger._rows
    assert len(seen) == 1 and hits
    sql, params, scope_, kw = seen[0]
    out = real("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params, scope_, **kw)[0][0]
    plan = out if isinstance(out, list) else json.loads(out)
    return dict(plan[0]["Plan"])


async def test_keyword_reads_only_matching_records(postgres: LocalPostgres, tmp_path: Path) -> None:
    url = postgres.new_schema()
    st = AsyncMemoryStore(
        url, embedder=HashingEmbedder(), settings=MemorySettings(index_dir=tmp_path / "r")
    )
    texts = [f"note {i} about the weekly standup and the build server" for i in range(600)]
    texts[17] = "the zanzibar trip is booked for March"
    texts[430] = "zanzibar needs a visa on arrival"
    await st.add_many(texts, user_id="u", check_conflicts=False)
    await st.add("zanzibar is where Bob goes diving", user_id="other")
    ledger = st.ledger
    assert isinstance(ledger, PostgresLedger)
    hits = ledger.keyword(Scope("u"), ["zanzibar"], 24)
    got = {r.text for r in ledger.by_rowids([h for h, _ in hits], Scope("u")).values()}
    assert got == {texts[17], texts[430]}  # the other user's match is out of scope
    plan = _explained_keyword(ledger, Scope("u"), ["zanzibar"])
    # Before: a scan of the user's 600 records, each filtered by the policy then by @@; now
    # the postings answer alone.
    assert _records_read(plan) == 0, json.dumps(plan)[:2000]
    await st.close()
    postgres.drop_schema(url)


async def test_postings_follow_writes_and_the_v1_upgrade(
    postgres: LocalPostgres, tmp_path: Path
) -> None:
    url = postgres.new_schema()
    with psycopg.connect(url) as conn:  # a ledger made by the previous release (schema 1)
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute(PG_V1)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute(SET_SCOPE, ("u",))
        conn.execute(
            "INSERT INTO records (id, user_id, text, type, source, confidence, created_at,"
            " weight, fingerprint) VALUES ('old1', 'u', 'the quokka lives on Rottnest',"
            " 'fact', 'user_explicit', 1.0, 0, 1.0, 'fp1')"
        )
    st = AsyncMemoryStore(
        url, embedder=HashingEmbedder(), settings=MemorySettings(index_dir=tmp_path / "r")
    )
    await st.open()  # migrates to the current schema: postings back-filled
    ledger = st.ledger
    assert isinstance(ledger, PostgresLedger)
    assert [r for r, _ in ledger.keyword(Scope("u"), ["quokka"], 5)] == [1]
    new = await st.add("a quokka selfie is a Rottnest tradition", user_id="u")
    rowid = (await st.get(new, user_id="u")).rowid
    # Ranked by how many of the query's lexemes a record holds, then the older first.
    assert ledger.keyword(Scope("u"), ["quokka", "selfie"], 5) == [(rowid, 2.0), (1, 1.0)]
    n_postings = "SELECT count(*) FROM postings WHERE rowid = %s"
    assert ledger._rows(n_postings, (rowid,))[0][0] > 0
    await st.forget(new, user_id="u")  # a delete takes its postings along
    assert ledger._rows(n_postings, (rowid,))[0][0] == 0
    assert [r for r, _ in ledger.keyword(Scope("u"), ["quokka"], 5)] == [1]
    # A superseded record leaves the postings: it can no longer take a keyword slot.
    newer = await st.add("the quokka moved to the Perth zoo", user_id="u", supersedes="old1")
    assert ledger._rows(n_postings, (1,))[0][0] == 0
    newer_rowid = (await st.get(newer, user_id="u")).rowid
    assert [r for r, _ in ledger.keyword(Scope("u"), ["quokka"], 5)] == [newer_rowid]
    await st.close()
    postgres.drop_schema(url)
