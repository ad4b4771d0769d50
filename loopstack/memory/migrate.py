"""``loopstack memory migrate --from sqlite:PATH --to postgresql://...``: one store, moved.

Copies every table of a SQLite ledger into an empty Postgres ledger, keeping record rowids,
change-log seqs and ids, so history (supersede chains, trust events), observations, keyword
statistics and the change log arrive as they were; then verifies: the row count of every
table, and a recall spot-check (the same top record for sampled records' texts on both
sides, through the full recall pipeline with the store's own embedder).

The copy runs in one Postgres transaction: a failed migration leaves the target empty.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Embedder, embedder_named, make_embedder
from loopstack.memory.exceptions import LedgerError
from loopstack.memory.ledger.postgres import PostgresLedger
from loopstack.memory.ledger.postgres_schema import ALL, SET_SCOPE
from loopstack.memory.ledger.rows import COLUMNS

__all__ = ["MigrationReport", "migrate", "parse_source"]

_REC_COLS = f"{COLUMNS}, fingerprint"
_REC_TYPES = (
    "bigint text text text text text text text float8 float8 float8 int float8 text text int text"
)
# table -> (SQLite SELECT, Postgres columns, Postgres array types)
_TABLES: dict[str, tuple[str, str, str]] = {
    "records": (f"SELECT {_REC_COLS} FROM records ORDER BY rowid", _REC_COLS, _REC_TYPES),
    "vectors": (
        "SELECT v.rowid, r.user_id, v.vec FROM vectors v JOIN records r ON r.rowid = v.rowid",
        "rowid, user_id, vec",
        "bigint text bytea",
    ),
    "events": (
        "SELECT e.record_id, r.user_id, e.ts, e.kind, e.detail FROM events e "
        "JOIN records r ON r.id = e.record_id ORDER BY e.rowid",
        "record_id, user_id, ts, kind, detail",
        "text text float8 text text",
    ),
    "changes": (
        "SELECT seq, op, rowid, user_id FROM changes ORDER BY seq",
        "seq, op, rowid, user_id",
        "bigint text bigint text",
    ),
    "observations": (
        "SELECT user_id, fingerprint, text, type, count, first_seen, last_seen, vec "
        "FROM observations",
        "user_id, fingerprint, text, type, count, first_seen, last_seen, vec",
        "text text text text int float8 float8 bytea",
    ),
    "user_terms": (
        "SELECT user_id, term, df FROM user_terms",
        "user_id, term, df",
        "text text int",
    ),
}
_META_KEYS = ("embedder", "decayed_at", "compacted_upto", "user_terms")


@dataclass
class MigrationReport:
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (from, to)
    spot_checked: int = 0
    spot_same: int = 0
    change_seq: int = 0

    @property
    def ok(self) -> bool:
        same = all(a == b for a, b in self.counts.values())
        return same and self.spot_same == self.spot_checked

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": {k: {"from": a, "to": b} for k, (a, b) in self.counts.items()},
            "recall_spot_check": f"{self.spot_same}/{self.spot_checked} same top record",
            "change_seq": self.change_seq,
        }


def parse_source(src: str) -> Path:
    """``sqlite:PATH`` or a plain path."""
    path = Path(src.removeprefix("sqlite:")).expanduser()
    if not path.exists():
        raise LedgerError(f"no SQLite ledger at {path}")
    return path


def _batches(cur: sqlite3.Cursor, size: int = 5_000) -> Iterator[list[tuple[Any, ...]]]:
    while rows := cur.fetchmany(size):
        yield rows


def _copy(src: sqlite3.Connection, dst: PostgresLedger) -> tuple[dict[str, int], int]:
    """Every table, in one Postgres transaction; returns source counts and the last seq."""
    counts: dict[str, int] = {}
    with dst.write() as tx:
        cur = tx.cur
        cur.execute("SELECT count(*) FROM records")
        row = cur.fetchone()
        if row and row[0]:
            raise LedgerError("the target Postgres ledger is not empty: migrate into a new one")
        for table, (select, cols, types) in _TABLES.items():
            n = 0
            unnest = ", ".join(f"%s::{t}[]" for t in types.split())
            for rows in _batches(src.execute(select)):
                columns = [list(c) for c in zip(*rows, strict=True)]
                cur.execute(f"INSERT INTO {table} ({cols}) SELECT * FROM unnest({unnest})", columns)
                n += len(rows)
            counts[table] = n
        last = src.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        seq = int(last[0]) if last else 0
        cur.execute("UPDATE change_seq SET last = %s", (seq,))
        cur.execute(
            "SELECT setval(pg_get_serial_sequence('records', 'rowid'), "
            "greatest((SELECT max(rowid) FROM records), 1))"
        )
        for key in _META_KEYS:
            value = src.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if value is not None:
                cur.execute(
                    "INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) "
                    "DO UPDATE SET value = excluded.value",
                    (key, str(value[0])),
                )
    return counts, seq


def _target_counts(dst: PostgresLedger) -> dict[str, int]:
    out = {}
    with dst.write() as tx:
        tx.cur.execute(SET_SCOPE, (ALL,))
        for table in _TABLES:
            tx.cur.execute(f"SELECT count(*) FROM {table}")
            row = tx.cur.fetchone()
            out[table] = int(row[0]) if row else -1
    return out


def embedder_for(stored: str | None, settings: MemorySettings) -> Embedder:
    """The store's own embedder (its ``embedder`` meta), so recall needs no re-embedding."""
    return embedder_named(stored, settings) or make_embedder(settings)


def _spot_check(
    src: Path, url: str, samples: list[tuple[str, str]], emb: Embedder, settings: MemorySettings
) -> int:
    from loopstack.memory.sync import (
        MemoryStore,  # its own loop thread: works inside a running loop
    )

    same = 0
    a = MemoryStore(src, embedder=emb, settings=settings)
    b = MemoryStore(url, embedder=emb, settings=settings)
    try:
        for user, text in samples:
            ra = a.recall(text, user_id=user, include_unverified=True, threshold=-1e9)
            rb = b.recall(text, user_id=user, include_unverified=True, threshold=-1e9)
            top_a = ra.candidates[0].record.id if ra.candidates else None
            top_b = rb.candidates[0].record.id if rb.candidates else None
            same += top_a == top_b and top_a is not None
    finally:
        a.close()
        b.close()
    return same


def migrate(
    source: str, url: str, *, samples: int = 20, settings: MemorySettings | None = None
) -> MigrationReport:
    """Copy the SQLite store at ``source`` into the empty Postgres ledger at ``url``."""
    settings = settings or MemorySettings()
    path = parse_source(source)
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    dst = PostgresLedger(url, allow_no_rls=settings.allow_no_rls)
    report = MigrationReport()
    try:
        counts, report.change_seq = _copy(src, dst)
        after = _target_counts(dst)
        report.counts = {t: (counts[t], after[t]) for t in _TABLES}
        rows = src.execute(
            "SELECT user_id, text FROM records WHERE superseded_by IS NULL"
        ).fetchall()
        stored = src.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
    finally:
        src.close()
        dst.close()
    picked = random.Random(0).sample(rows, min(samples, len(rows)))
    if picked:
        emb = embedder_for(stored[0] if stored else None, settings)
        report.spot_checked = len(picked)
        report.spot_same = _spot_check(path, url, picked, emb, settings)
    return report
