"""The two ledgers' tables agree (issue 45, item 4): one declaration
(``loopstack.memory.ledger.schema``) renders both, and here each real database's own catalogue
(SQLite's ``PRAGMA table_info``, Postgres's ``information_schema.columns``) is read back and
compared column by column: names and order, nullability, and types mapped through each dialect.
Ledgers of the previous schema (SQLite 1, Postgres 1) open, keep every row and end with the same
columns."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.memory.ledger.postgres import PostgresLedger
from loopstack.memory.ledger.rows import POSTGRES, SQLITE
from loopstack.memory.ledger.schema import TABLES, Table, tables_of
from loopstack.memory.ledger.sqlite import SCHEMA_VERSION, SqliteLedger
from tests.unit.memory.ledger_history import PG_V1, SQLITE_V1

Columns = list[tuple[str, str, bool]]  # (name, type, nullable)


def sqlite_columns(path: Path, table: str) -> Columns:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    # An INTEGER PRIMARY KEY is the rowid: never NULL whatever its declaration says.
    return [(r[1], r[2].upper(), not (r[3] or (r[5] and r[2].upper() == "INTEGER"))) for r in rows]


def postgres_columns(url: str, table: str) -> Columns:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
    return [(r[0], r[1].upper(), r[2] == "YES") for r in rows]


def declared(table: Table, dialect: str) -> Columns:
    d = SQLITE if dialect == "sqlite" else POSTGRES
    return [(c.name, d.type_of(c.type).upper(), c.null) for c in table.columns_in(d.name)]


def shared(table: Table, cols: Columns, types: dict[str, str]) -> list[tuple[str, str, bool]]:
    """The columns both databases have, with each type as its portable kind."""
    mine = {c.name for c in table.columns if c.only is not None}
    return [(n, types[n], null) for n, _, null in cols if n not in mine]


def assert_agree(sqlite_path: Path, pg_url: str) -> None:
    for table in TABLES:
        kinds = {c.name: c.type for c in table.columns}
        lite = sqlite_columns(sqlite_path, table.name) if table.only != "postgres" else None
        pg = postgres_columns(pg_url, table.name) if table.only != "sqlite" else None
        if lite is not None:
            assert lite == declared(table, "sqlite"), table.name
        if pg is not None:
            assert pg == declared(table, "postgres"), table.name
        if lite is not None and pg is not None:
            assert shared(table, lite, kinds) == shared(table, pg, kinds), table.name


@pytest.fixture
def pg_url(postgres: LocalPostgres) -> Iterator[str]:
    url = postgres.new_schema()
    yield url
    postgres.drop_schema(url)


def test_a_new_sqlite_and_a_new_postgres_ledger_agree(tmp_path: Path, pg_url: str) -> None:
    SqliteLedger(tmp_path / "m.db").close()
    PostgresLedger(pg_url).close()
    assert_agree(tmp_path / "m.db", pg_url)
    # what the databases made is what each dialect declares, table for table
    with sqlite3.connect(tmp_path / "m.db") as conn:
        lite = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {t.name for t in tables_of("sqlite")} <= lite
    with psycopg.connect(pg_url) as conn:
        pg = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        }
    assert pg == {t.name for t in tables_of("postgres")}


def test_events_carry_their_owner_on_both(tmp_path: Path, pg_url: str) -> None:
    from loopstack.memory.ledger.rows import NewRecord
    from loopstack.memory.records import MemorySource, MemoryType, Scope

    def rec() -> NewRecord:
        return NewRecord(
            scope=Scope("alice"),
            text="alice likes tea",
            type=MemoryType("fact"),
            source=MemorySource("user_explicit"),
            confidence=1.0,
            weight=1.0,
            evidence=[],
            fingerprint="fp",
            created_at=1.0,
        )

    import numpy as np

    for ledger in (SqliteLedger(tmp_path / "e.db"), PostgresLedger(pg_url)):
        [(rid, _)] = ledger.insert([rec()], np.ones((1, 4), dtype=np.float32))
        with ledger.write() as tx:
            tx.event(rid, "confirmed", "the user said so")
        rows = ledger._rows("SELECT record_id, user_id, kind FROM events", (), "alice")
        assert [tuple(r) for r in rows] == [(rid, "alice", "confirmed")]
        ledger.close()


def test_a_schema_1_sqlite_file_opens_keeps_every_row_and_agrees(
    tmp_path: Path, pg_url: str
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # a file of the previous release, with history
        conn.executescript(SQLITE_V1)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('embedder', 'h:4')")
        conn.execute(
            "INSERT INTO records (id, user_id, text, type, source, confidence, created_at, "
            "weight, fingerprint, scope_token) VALUES "
            "('m1', 'bob', 'bob owns a red bike', 'fact', 'user_explicit', 1, 0, 1, 'f1', 't'),"
            "('m2', 'bob', 'bob owns a blue bike', 'fact', 'user_explicit', 1, 1, 1, 'f2', 't')"
        )
        conn.execute("INSERT INTO vectors VALUES (1, x'00'), (2, x'01')")
        conn.execute(
            "INSERT INTO events (record_id, ts, kind, detail) VALUES "
            "('m1', 5, 'contradicted', 'superseded by m2'), ('m2', 5, 'confirmed', 'said so'),"
            "('gone', 6, 'confirmed', 'a record deleted since')"
        )
    ledger = SqliteLedger(path)
    assert ledger.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert ledger.get_meta("embedder") == "h:4"
    assert [r.id for r in ledger.list_records("bob")] == ["m2", "m1"]
    events = ledger.events(["m1", "m2"])
    assert [e.detail for e in events["m1"]] == ["superseded by m2"]
    assert [e.kind for e in events["m2"]] == ["confirmed"]
    rows = ledger._rows("SELECT seq, record_id, user_id FROM events ORDER BY seq")
    assert [tuple(r) for r in rows] == [(1, "m1", "bob"), (2, "m2", "bob"), (3, "gone", "")]
    ledger.close()
    SqliteLedger(path).close()  # opening it again changes nothing
    PostgresLedger(pg_url).close()
    assert_agree(path, pg_url)


def test_a_schema_1_postgres_ledger_upgrades_to_the_declared_columns(
    tmp_path: Path, postgres: LocalPostgres
) -> None:
    old, new = postgres.new_schema(), postgres.new_schema()
    try:
        with psycopg.connect(old) as conn:  # a ledger made by the first release
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            conn.execute(PG_V1)  # type: ignore[arg-type]
            conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        PostgresLedger(old).close()
        PostgresLedger(new).close()
        for table in TABLES:
            if table.only != "sqlite":
                assert postgres_columns(old, table.name) == postgres_columns(new, table.name)
        SqliteLedger(tmp_path / "m.db").close()
        assert_agree(tmp_path / "m.db", old)
    finally:
        postgres.drop_schema(old)
        postgres.drop_schema(new)
