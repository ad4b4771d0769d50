"""The plain rows both ledgers read and write, and the SQL spelling of each database.

:class:`NewRecord` (a record about to be written), :class:`Change` (one change-log entry),
the ``records`` columns every read selects and the mapping of a row back to a
:class:`~loopstack.memory.records.Record`, trust events and vectors; :class:`Dialect` (``?`` or
``%s``,
``max``/``greatest``, ...) with :data:`SQLITE` and :data:`POSTGRES`; the schema-version check
both run when they open. ``loopstack.memory.ledger.common`` builds the shared ledger on these.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from loopstack.memory.embedding import Vectors
from loopstack.memory.exceptions import LedgerError, SchemaVersionError
from loopstack.memory.ledger.schema import ColumnType
from loopstack.memory.records import EventKind, MemorySource, MemoryType, Record, Scope, TrustEvent

__all__ = [
    "COLUMNS",
    "FORGOTTEN",
    "INSERT_COLUMNS",
    "POSTGRES",
    "SQLITE",
    "STATS_SQL",
    "TOMBSTONE_TEXT",
    "Change",
    "Dialect",
    "NewRecord",
    "check_schema_version",
    "check_vectors",
    "event_from_row",
    "group_by_user",
    "insert_values",
    "new_id",
    "row_to_record",
    "texts_by_user",
]

#: The ``records`` columns every read selects, in :func:`row_to_record`'s order.
COLUMNS = (
    "rowid, id, user_id, agent_id, session_id, text, type, source, confidence, created_at, "
    "last_used_at, hits, weight, superseded_by, evidence, mentions"
)
#: The ``records`` columns an insert writes, in :func:`insert_values`'s order.
INSERT_COLUMNS = (
    "id, user_id, agent_id, session_id, text, type, source, confidence, created_at, weight, "
    "evidence, fingerprint, mentions"
)

#: ``stats()`` figures, the same SQL on SQLite and Postgres.
STATS_SQL = {
    "records": "SELECT count(*) FROM records",
    "active": "SELECT count(*) FROM records WHERE superseded_by IS NULL",
    "forgotten": "SELECT count(DISTINCT record_id) FROM events WHERE kind = 'forgotten'",
    "users": "SELECT count(DISTINCT user_id) FROM records",
    "observations": "SELECT count(*) FROM observations",
    "pending_changes": "SELECT count(*) FROM changes",
}


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what the shared SQL needs."""

    name: Literal["sqlite", "postgres"]
    p: str  # a query parameter
    greatest: str  # the largest of its arguments (SQLite's scalar max() takes several)
    power: str
    max_in: int  # most values one IN list may bind (SQLite's variable limit)
    least: str = "min"  # the smallest of its arguments
    for_update: str = ""  # row lock of a read in a write transaction (SQLite: the whole file)

    def type_of(self, kind: ColumnType) -> str:
        """The name of a :mod:`loopstack.memory.ledger.schema` column type in this database."""
        return _TYPES[self.name][kind]

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values``: the SQL and its parameters."""
        if self.name == "sqlite":
            return f"{column} IN ({','.join('?' * len(values))})", list(values)
        return f"{column} = ANY(%s)", [list(values)]


#: Column types by dialect (SQLite's type affinities; Postgres's own names).
_TYPES: dict[str, dict[str, str]] = {
    "sqlite": {
        **dict.fromkeys(("int", "bigint", "bool"), "INTEGER"),
        **{"text": "TEXT", "real": "REAL", "blob": "BLOB", "tsvector": "TEXT"},
    },
    "postgres": {
        **{"text": "TEXT", "int": "INTEGER", "bigint": "BIGINT", "bool": "BOOLEAN"},
        **{"real": "DOUBLE PRECISION", "blob": "BYTEA", "tsvector": "tsvector"},
    },
}

SQLITE = Dialect("sqlite", "?", "max", "pow", 900)
POSTGRES = Dialect("postgres", "%s", "greatest", "power", 1 << 30, "least", " FOR UPDATE")


#: ``superseded_by`` of a forgotten record that nothing newer replaced (see ``tombstone``).
FORGOTTEN = "forgotten"
#: The text a forgotten record keeps in the ledger.
TOMBSTONE_TEXT = "[forgotten]"


def new_id() -> str:
    return "mem_" + uuid.uuid4().hex[:16]


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


def event_from_row(row: Sequence[Any]) -> TrustEvent:
    kind: EventKind = row[1]
    return TrustEvent(ts=float(row[0]), kind=kind, detail=str(row[2]))


def insert_values(rec: NewRecord) -> tuple[Any, ...]:
    """The :data:`INSERT_COLUMNS` values of ``rec``."""
    s = rec.scope
    return (
        *(rec.id, s.user_id, s.agent_id, s.session_id, rec.text, rec.type.value),
        *(rec.source.value, rec.confidence, rec.created_at, rec.weight),
        *(json.dumps(rec.evidence), rec.fingerprint, rec.mentions),
    )


def check_vectors(records: Sequence[NewRecord], vectors: Vectors) -> None:
    """One vector per record, and an id for each record that has none yet."""
    if len(records) != len(vectors):
        raise LedgerError("one vector per record is required")
    for rec in records:
        rec.id = rec.id or new_id()


def texts_by_user(records: Iterable[NewRecord]) -> dict[str, list[str]]:
    """The records' texts by user (their keyword statistics are counted per user)."""
    out: dict[str, list[str]] = {}
    for rec in records:
        out.setdefault(rec.scope.user_id, []).append(rec.text)
    return out


def group_by_user(rows: Sequence[tuple[Any, ...]], dim: int) -> Iterator[tuple[str, Any, Vectors]]:
    """(rowid, user_id, vector bytes) rows -> (user_id, rowids, vectors) per user."""
    by_user: dict[str, list[tuple[int, bytes]]] = {}
    for rowid, user_id, blob in rows:
        by_user.setdefault(str(user_id), []).append((int(rowid), bytes(blob)))
    for user_id, items in by_user.items():
        ids = np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))
        vecs = np.frombuffer(b"".join(b for _, b in items), dtype=np.float32)
        yield user_id, ids, vecs.reshape(len(items), dim)


def check_schema_version(where: str, found: int, known: int) -> None:
    """Refuse a ledger written by a newer release (a schema this code does not know)."""
    if found > known:
        raise SchemaVersionError(f"{where} has schema {found} > {known}")
