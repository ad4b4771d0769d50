"""The ledger seam: what the store, its writer, reader and replica need from a ledger.

Two ledgers implement it: :class:`loopstack.memory.ledger.sqlite.SqliteLedger` (one SQLite file, the
embedded default) and :class:`loopstack.memory.ledger.postgres.PostgresLedger` (one PostgreSQL
database shared by many app servers); what they share is written once in
``loopstack.memory.ledger.common``. :func:`open_ledger` picks one from a location: a path, or a
``postgresql://`` URL.

Both keep the same contract (the store, recall and trust suites under ``tests/unit/memory``
run on both): records with their vectors, keyword recall, per-user term statistics, trust events, an
append-only change log whose ``seq`` values are consecutive and become visible in order, and
``write()`` transactions in which every read sees every earlier commit of the same scope, so
the writer's duplicate and supersede decisions hold when the transaction commits.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from loopstack.memory.embedding import Vectors
from loopstack.memory.ledger.common import redact_url
from loopstack.memory.ledger.rows import Change, NewRecord
from loopstack.memory.records import EventKind, MemoryType, Record, Scope, TrustEvent

__all__ = [
    "LedgerBackend",
    "LedgerTx",
    "is_url",
    "open_ledger",
    "redact_url",
    "url_key",
]

_URL = re.compile(r"^postgres(ql)?://", re.IGNORECASE)


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names a Postgres database rather than a SQLite file."""
    return isinstance(location, str) and bool(_URL.match(location))


def url_key(url: str) -> str:
    """A short stable name for a database URL (the local replica folder's name)."""
    return "pg-" + hashlib.sha1(redact_url(url).encode()).hexdigest()[:12]


class LedgerTx(Protocol):
    """Writes, and the reads decisions need, inside one ledger transaction."""

    def lock_scope(self, user_id: str) -> None:
        """Serialise this transaction with every other write of ``user_id`` (any process,
        any machine) until it ends; reads after it see all their commits."""

    def get(self, record_id: str) -> Record | None: ...
    def by_fingerprints(self, user_id: str, fingerprints: Sequence[str]) -> dict[str, Record]:
        """The oldest active record of ``user_id`` with each of ``fingerprints`` (if any)."""

    def active(self, rowids: Sequence[int], user_id: str) -> dict[int, Record]: ...
    def count_terms(self, user_id: str, texts: Sequence[str], delta: int) -> None: ...
    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]: ...
    def supersede(self, old: Record, new_id_: str, detail: str = "") -> None: ...
    def delete(self, records: Iterable[Record]) -> int: ...
    def tombstone(self, records: Iterable[Record], detail: str) -> int: ...
    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None: ...
    def confirm(
        self, rec: Record, evidence: Sequence[str], confidence: float, detail: str
    ) -> None: ...
    def event(self, record_id: str, kind: EventKind, detail: str) -> None: ...


class LedgerBackend(Protocol):
    """The source of truth. Every method blocks: call them off the event loop."""

    def close(self) -> None: ...
    def describe(self) -> str:
        """Where the ledger lives (a path, or a URL without its password)."""

    def on_change(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from another thread) when other processes may have appended to
        the change log; a ledger that cannot tell never calls it (readers poll anyway)."""

    # meta
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    # writes
    def write(self) -> AbstractContextManager[LedgerTx]: ...
    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]: ...
    def supersede(self, old: Record, new_id_: str, detail: str = "") -> None: ...
    def delete(self, records: Iterable[Record]) -> int: ...
    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None: ...
    def touch(self, usage: dict[int, tuple[int, float]]) -> None: ...
    def observe(
        self, user_id: str, fingerprint: str, text: str, type_: MemoryType, vec: Vectors, ts: float
    ) -> int: ...
    def drop_observation(self, user_id: str, fingerprint: str) -> None: ...
    def decay(
        self, now: float, half_life_days: float, prune_below: float, explicit_floor: float = 0.0
    ) -> tuple[int, list[Record]]: ...
    def compact_changes(self, upto_seq: int) -> None: ...
    def set_vectors(self, pairs: Sequence[tuple[int, Vectors]]) -> None: ...

    # reads
    def get(self, record_id: str) -> Record | None: ...
    def by_rowids(self, rowids: Sequence[int], scope: Scope) -> dict[int, Record]: ...
    def vectors(self, rowids: Sequence[int], dim: int) -> dict[int, Vectors]: ...
    def by_fingerprint(self, user_id: str, fingerprint: str) -> Record | None: ...
    def list_records(
        self, user_id: str, *, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]: ...
    def predecessors(self, record_id: str) -> list[Record]: ...
    def keyword(self, scope: Scope, terms: Sequence[str], k: int) -> list[tuple[int, float]]: ...
    def doc_freq(self, user_id: str, terms: Sequence[str]) -> dict[str, int]: ...
    def events(self, record_ids: Sequence[str]) -> dict[str, list[TrustEvent]]: ...
    def active_rowids(self, rowids: Sequence[int]) -> list[int]: ...
    def texts_after(self, rowid: int, limit: int = 512) -> list[tuple[int, str]]: ...
    def count(self, user_id: str | None = None, *, active_only: bool = True) -> int: ...
    def observations(self, user_id: str) -> list[tuple[str, str, int, Vectors]]: ...
    def max_seq(self) -> int: ...
    def changes_since(self, seq: int) -> list[Change]: ...
    def active_vectors(
        self, dim: int, batch: int = 50_000
    ) -> Iterator[tuple[str, Any, Vectors]]: ...
    def stats(self) -> dict[str, Any]: ...


def open_ledger(location: str | Path, *, allow_no_rls: bool = False) -> LedgerBackend:
    """A SQLite ledger for a path, a Postgres ledger for a ``postgresql://`` URL (which
    refuses a role that bypasses row-level security unless ``allow_no_rls``)."""
    if is_url(location):
        from loopstack.memory.ledger.postgres import (
            PostgresLedger,  # psycopg only imported when used
        )

        return PostgresLedger(str(location), allow_no_rls=allow_no_rls)
    from loopstack.memory.ledger.sqlite import SqliteLedger

    return SqliteLedger(location)
