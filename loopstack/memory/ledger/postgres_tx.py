"""Writing transactions of the Postgres ledger (``loopstack.memory.ledger.postgres``).

``PostgresTransaction`` checks a connection out of the pool, runs one transaction under the
maintenance scope (or one user's, after ``PostgresTx.lock_scope``), and at commit appends the
buffered change-log entries through the ``change_seq`` counter row and sends the NOTIFY that
wakes other app servers' replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from typing import Any, Literal

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from loopstack.memory.embedding import Vectors
from loopstack.memory.exceptions import LedgerError
from loopstack.memory.ledger.common import SqlTx
from loopstack.memory.ledger.postgres_schema import ALL, CHANNEL, SET_SCOPE
from loopstack.memory.ledger.rows import (
    COLUMNS,
    INSERT_COLUMNS,
    POSTGRES,
    NewRecord,
    check_vectors,
    insert_values,
    row_to_record,
    texts_by_user,
)
from loopstack.memory.pipeline import doc_terms
from loopstack.memory.records import Record

__all__ = ["PostgresTransaction", "PostgresTx", "errors"]


def errors(what: str) -> Callable[[BaseException], LedgerError]:
    """Wraps a driver or pool error into a :class:`LedgerError` that says what failed."""

    def wrap(exc: BaseException) -> LedgerError:
        return LedgerError(f"postgres ledger: {what} failed: {type(exc).__name__}: {exc}")

    return wrap


class PostgresTx(SqlTx):
    """Writes (and the reads decisions need) inside one Postgres transaction. Change-log
    entries and keyword document-frequency deltas are buffered and written at commit (see
    :class:`PostgresTransaction`).

    Writes whose result nobody reads (``send``) go out in pipeline mode: a run of them costs
    no round trip of its own, it travels with the next read (``cur`` sends and checks them
    first, so a read always sees them and their errors surface before it), or the commit.
    """

    dialect = POSTGRES

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._cur = conn.cursor()
        self._pipe: ExitStack | None = None
        self.changes: list[tuple[str, int, str]] = []
        self._terms: dict[str, dict[str, int]] = {}  # user -> term -> pending df delta
        self._terms_sign = 0

    @property
    def cur(self) -> psycopg.Cursor[Any]:
        """The cursor for reads (and writes whose result is needed), after ``sync``."""
        self.sync()
        return self._cur

    def send(self, sql: str, params: Sequence[Any]) -> None:
        """Queue a write whose result is not needed (pipeline mode)."""
        if self._pipe is None:
            stack = ExitStack()
            stack.enter_context(self.conn.pipeline())
            self._pipe = stack
        self.conn.execute(sql, params)

    def sync(self) -> None:
        """Send the queued writes and wait for them; raises the first one's error."""
        if self._pipe is not None:
            stack, self._pipe = self._pipe, None
            stack.close()

    def lock_scope(self, user_id: str) -> None:
        # Not pipelined: the caller relies on holding the lock when this returns.
        self.cur.execute(SET_SCOPE, (user_id,))
        self.cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("memory:" + user_id,)
        )

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.cur.execute(sql, params)
        return self.cur.rowcount

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self.cur.execute(sql, params)
        return self.cur.fetchall()

    def many(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        self.cur.executemany(sql, params)

    def log_change(self, op: Literal["add", "del"], rowid: int, user_id: str) -> None:
        """Buffered until commit (:meth:`flush_changes`)."""
        self.changes.append((op, rowid, user_id))

    def by_fingerprints(self, user_id: str, fingerprints: Sequence[str]) -> dict[str, Record]:
        if not fingerprints:
            return {}
        self.cur.execute(
            f"SELECT DISTINCT ON (fingerprint) fingerprint, {COLUMNS} FROM records "
            "WHERE user_id = %s AND fingerprint = ANY(%s) AND superseded_by IS NULL "
            "ORDER BY fingerprint, rowid",
            (user_id, list(fingerprints)),
        )
        return {str(r[0]): row_to_record(r[1:]) for r in self.cur.fetchall()}

    def count_terms(self, user_id: str, texts: Sequence[str], delta: int) -> None:
        """Buffered: updating the same ``user_terms`` row once per superseded record made a
        bulk add quadratic (each update walks the row's versions of this transaction).
        Deltas of one sign add up; a delta of the other sign writes them first, so the
        clamp at 0 of removals gives what one update per call would."""
        if delta == 0:
            return
        sign = 1 if delta > 0 else -1
        if self._terms and sign != self._terms_sign:
            self._flush_terms()
        self._terms_sign = sign
        counts = self._terms.setdefault(user_id, {})
        for terms in doc_terms(texts):
            for t in terms:
                counts[t] = counts.get(t, 0) + delta

    def _flush_terms(self) -> None:
        pending, self._terms = self._terms, {}
        for user_id, counts in sorted(pending.items()):
            if not counts:
                continue
            terms_, deltas = zip(*sorted(counts.items()), strict=True)  # one lock order
            if self._terms_sign > 0:
                self.send(
                    "INSERT INTO user_terms(user_id, term, df) SELECT %s, t, d FROM "
                    "unnest(%s::text[], %s::int[]) AS x(t, d) ON CONFLICT (user_id, term) "
                    "DO UPDATE SET df = user_terms.df + excluded.df",
                    (user_id, list(terms_), list(deltas)),
                )
            else:
                self.send(
                    "UPDATE user_terms u SET df = greatest(u.df + x.d, 0) FROM unnest(%s::text[],"
                    " %s::int[]) AS x(t, d) WHERE u.user_id = %s AND u.term = x.t",
                    (list(terms_), list(deltas), user_id),
                )

    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]:
        check_vectors(records, vectors)
        if not records:
            return []
        cols = list(zip(*[insert_values(r) for r in records], strict=True))
        self.cur.execute(
            f"INSERT INTO records ({INSERT_COLUMNS}) SELECT * FROM"
            " unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
            " %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::text[], %s::text[],"
            " %s::int[]) RETURNING id, rowid",
            [list(c) for c in cols],
        )
        rowid_of = {str(i): int(r) for i, r in self.cur.fetchall()}
        out = [(r.id, rowid_of[r.id]) for r in records]
        self.send(
            "INSERT INTO vectors(rowid, user_id, vec) "
            "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bytea[])",
            (
                [rowid for _, rowid in out],
                [r.scope.user_id for r in records],
                [np.asarray(v, dtype=np.float32).tobytes() for v in vectors],
            ),
        )
        for (_, rowid), r in zip(out, records, strict=True):
            self.log_change("add", rowid, r.scope.user_id)
        for user_id, texts in texts_by_user(records).items():
            self.count_terms(user_id, texts, +1)
        return out

    def flush_changes(self) -> None:
        """Append the buffered change-log entries: the counter row's lock orders commits,
        so seqs are consecutive and visible in order; NOTIFY is delivered at commit."""
        self._flush_terms()
        if not self.changes:
            return
        n = len(self.changes)
        self.cur.execute("UPDATE change_seq SET last = last + %s RETURNING last", (n,))
        row = self.cur.fetchone()
        last = int(row[0]) if row else n
        first = last - n + 1
        ops, rowids, users = zip(*self.changes, strict=True)
        self.send(
            "INSERT INTO changes(seq, op, rowid, user_id) SELECT * FROM "
            "unnest(%s::bigint[], %s::text[], %s::bigint[], %s::text[])",
            (list(range(first, last + 1)), list(ops), list(rowids), list(users)),
        )
        self.send("SELECT pg_notify(%s, %s)", (CHANNEL, str(last)))
        self.sync()


class PostgresTransaction:
    """``with ledger.write() as tx``: a pooled connection, BEGIN, COMMIT or ROLLBACK."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self._pool = pool
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> PostgresTx:
        for attempt in (1, 2):  # a connection that died with a server restart: once more
            try:
                self._conn = self._pool.getconn()
                self._conn.execute(SET_SCOPE, (ALL,))
                self._tx = PostgresTx(self._conn)
                return self._tx
            except psycopg.OperationalError as exc:
                self._release()
                if attempt == 2:
                    raise errors("starting a write")(exc) from exc
            except (psycopg.Error, PoolTimeout) as exc:
                self._release()
                raise errors("starting a write")(exc) from exc
        raise AssertionError("unreachable")

    def _release(self) -> None:
        if self._conn is not None:
            self._pool.putconn(self._conn)
            self._conn = None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        conn = self._conn
        assert conn is not None
        try:
            if exc_type is None:
                self._tx.flush_changes()
                self._tx.sync()
                conn.commit()
            else:
                try:
                    self._tx.sync()
                except psycopg.Error:
                    pass  # the transaction is rolled back anyway
                conn.rollback()
        except psycopg.Error as err:
            # COMMIT failed or its answer was lost: the write is not acknowledged.
            try:
                conn.rollback()
            except psycopg.Error:
                pass
            raise errors("a write")(err) from err
        finally:
            self._release()
        if isinstance(exc, psycopg.Error):
            raise errors("a write")(exc) from exc
