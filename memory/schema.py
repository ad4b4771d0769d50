"""The ledger's SQL schema and the plain rows it reads and writes.

Tables: ``records`` (one row per memory, superseded versions kept), ``vectors`` (the
float32 embedding of each record), ``records_fts`` (FTS5 with a per-user scope token),
``changes`` (the append-only log the vector index replays), ``observations`` (facts seen but
not yet promoted), ``events`` (trust events: confirmed / contradicted, the verification
path's history), ``user_terms`` (per-user keyword document frequencies) and ``meta``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memory.records import EventKind, MemorySource, MemoryType, Record, Scope, TrustEvent

__all__ = [
    "COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STATS_SQL",
    "Change",
    "NewRecord",
    "event_from_row",
    "new_id",
    "placeholders",
    "row_to_record",
    "scope_token",
]

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    rowid         INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    user_id       TEXT NOT NULL,
    agent_id      TEXT,
    session_id    TEXT,
    text          TEXT NOT NULL,
    type          TEXT NOT NULL,
    source        TEXT NOT NULL,
    confidence    REAL NOT NULL,
    created_at    REAL NOT NULL,
    last_used_at  REAL,
    hits          INTEGER NOT NULL DEFAULT 0,
    weight        REAL NOT NULL,
    superseded_by TEXT,
    evidence      TEXT NOT NULL DEFAULT '[]',
    mentions      INTEGER NOT NULL DEFAULT 1,
    fingerprint   TEXT NOT NULL,
    scope_token   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_user ON records(user_id, superseded_by);
CREATE INDEX IF NOT EXISTS records_fp ON records(user_id, fingerprint);
CREATE INDEX IF NOT EXISTS records_sup ON records(superseded_by);
CREATE TABLE IF NOT EXISTS vectors (rowid INTEGER PRIMARY KEY, vec BLOB NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS records_fts USING fts5(
    text, scope_token, content='records', content_rowid='rowid',
    tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE IF NOT EXISTS records_vocab USING fts5vocab(records_fts, 'row');
CREATE TRIGGER IF NOT EXISTS records_ai AFTER INSERT ON records BEGIN
    INSERT INTO records_fts(rowid, text, scope_token)
    VALUES (new.rowid, new.text, new.scope_token);
END;
-- Superseded records leave the FTS index (so keyword recall needs no join to skip them).
CREATE TRIGGER IF NOT EXISTS records_au AFTER UPDATE OF superseded_by ON records
WHEN old.superseded_by IS NULL AND new.superseded_by IS NOT NULL BEGIN
    INSERT INTO records_fts(records_fts, rowid, text, scope_token)
    VALUES ('delete', old.rowid, old.text, old.scope_token);
END;
CREATE TRIGGER IF NOT EXISTS records_ad AFTER DELETE ON records BEGIN
    INSERT INTO records_fts(records_fts, rowid, text, scope_token)
    SELECT 'delete', old.rowid, old.text, old.scope_token WHERE old.superseded_by IS NULL;
    DELETE FROM vectors WHERE rowid = old.rowid;
END;
CREATE TABLE IF NOT EXISTS changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    op      TEXT NOT NULL CHECK (op IN ('add', 'del')),
    rowid   INTEGER NOT NULL,
    user_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS observations (
    user_id     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    text        TEXT NOT NULL,
    type        TEXT NOT NULL,
    count       INTEGER NOT NULL,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    vec         BLOB NOT NULL,
    PRIMARY KEY (user_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS events (
    record_id TEXT NOT NULL,
    ts        REAL NOT NULL,
    kind      TEXT NOT NULL,
    detail    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_record ON events(record_id);
CREATE TABLE IF NOT EXISTS user_terms (
    user_id TEXT NOT NULL,
    term    TEXT NOT NULL,
    df      INTEGER NOT NULL,
    PRIMARY KEY (user_id, term)
) WITHOUT ROWID;
"""

#: ``stats()`` figures, the same SQL on SQLite and Postgres.
STATS_SQL = {
    "records": "SELECT count(*) FROM records",
    "active": "SELECT count(*) FROM records WHERE superseded_by IS NULL",
    "users": "SELECT count(DISTINCT user_id) FROM records",
    "observations": "SELECT count(*) FROM observations",
    "pending_changes": "SELECT count(*) FROM changes",
}

COLUMNS = (
    "rowid, id, user_id, agent_id, session_id, text, type, source, confidence, created_at, "
    "last_used_at, hits, weight, superseded_by, evidence, mentions"
)


def new_id() -> str:
    return "mem_" + uuid.uuid4().hex[:16]


def scope_token(user_id: str) -> str:
    """An FTS token that stands for the user, so keyword recall intersects with it."""
    return "u" + uuid.uuid5(uuid.NAMESPACE_URL, "loopstack-user:" + user_id).hex


@dataclass(slots=True)
class NewRecord:
    """A record about to be written, with its vector."""

    scope: Scope
    text: str
    type: MemoryType
    source: MemorySource
    confidence: float
    weight: float
    evidence: list[str]
    fingerprint: str
    created_at: float
    id: str = ""
    mentions: int = 1


@dataclass(frozen=True, slots=True)
class Change:
    seq: int
    op: Literal["add", "del"]
    rowid: int
    user_id: str


def row_to_record(row: Sequence[Any]) -> Record:
    return Record(
        rowid=int(row[0]),
        id=row[1],
        scope=Scope(row[2], row[3], row[4]),
        text=row[5],
        type=MemoryType(row[6]),
        source=MemorySource(row[7]),
        confidence=float(row[8]),
        created_at=float(row[9]),
        last_used_at=None if row[10] is None else float(row[10]),
        hits=int(row[11]),
        weight=float(row[12]),
        superseded_by=row[13],
        evidence=json.loads(row[14]),
        mentions=int(row[15]),
    )


def placeholders(n: int) -> str:
    return ",".join("?" * n)


def event_from_row(row: Sequence[Any]) -> TrustEvent:
    kind: EventKind = row[1]
    return TrustEvent(ts=float(row[0]), kind=kind, detail=str(row[2]))
