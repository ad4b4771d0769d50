"""The Postgres ledger: one database shared by every app server (``LOOPSTACK_MEMORY_URL``).

The same contract as the SQLite ledger (``loopstack.memory.ledger.backend.LedgerBackend``; the SQL
the two share is in ``loopstack.memory.ledger.common``) on psycopg 3 with a connection pool. Each
app server keeps its own FAISS replica (``loopstack.memory.replica``) caught up from the shared
change log; a listener connection (``LISTEN loopstack_memory``) wakes it when another server
commits, and the replay of the log after a reconnect (or a periodic poll) makes up for any
notification lost.

Concurrency: a writing transaction of one user takes a transaction-scoped advisory lock
keyed by the user (``lock_scope``), so the writer's duplicate and supersede decisions are
taken on every earlier commit of that user, on whatever server it was made, and two servers
adding the same fact cannot both insert it; writes of different users never wait for each
other (except for the few microseconds of the change-log counter at commit).

Isolation: every transaction sets ``loopstack.user_id`` (``SET LOCAL``) and row-level
security (``loopstack.memory.ledger.postgres_schema``) limits what its queries can see to that
user's rows.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from loopstack.memory.exceptions import LedgerError, RowSecurityError
from loopstack.memory.ledger.common import SqlLedger, redact_url
from loopstack.memory.ledger.postgres_schema import (
    ALL,
    CHANNEL,
    CURRENT,
    MIGRATIONS,
    PG_SCHEMA_VERSION,
    SET_SCOPE,
)
from loopstack.memory.ledger.postgres_tx import PostgresTransaction, errors
from loopstack.memory.ledger.rows import POSTGRES, check_schema_version
from loopstack.memory.ledger.schema import META, create_table
from loopstack.memory.records import Scope

__all__ = ["KEYWORD_SQL", "PostgresLedger", "keyword_params", "keyword_words"]

logger = logging.getLogger(__name__)

#: Change-log entries kept behind the newest saved replica position: another app server's
#: replica this far behind replays instead of rebuilding.
RETAIN_CHANGES = 200_000


#: Keyword recall. Under row-level security a condition that is not LEAKPROOF (``tsv @@ q``)
#: runs only after the policy, so it cannot drive an index: a GIN index on ``tsv`` went
#: unused and every record of the user was scanned. The postings btree (``text =``:
#: LEAKPROOF) of the active records answers it alone, from the index: a record's score is
#: the number of the query's lexemes it holds (what ``ts_rank`` gave short memory lines,
#: without reading each record); ties go to the older record. Run without parallel
#: workers: starting them took 10-60 ms of a 1-10 ms query.
KEYWORD_SQL = (
    "SELECT rowid, count(*)::float8 FROM postings WHERE user_id = %s "
    "AND term = ANY(tsvector_to_array(to_tsvector('english', %s))) "
    "GROUP BY rowid ORDER BY 2 DESC, rowid LIMIT %s"
)


def keyword_words(terms: Sequence[str]) -> list[str]:
    """The words of the query terms, unique."""
    return list(dict.fromkeys(w for t in terms for w in re.findall(r"\w+", t)))


def keyword_params(scope: Scope, words: Sequence[str], k: int) -> tuple[Any, ...]:
    """Parameters of :data:`KEYWORD_SQL` for these words (any of them matches)."""
    return (scope.user_id, " ".join(words), k)


class PostgresLedger(SqlLedger):
    """Thread-safe access to one Postgres database. All methods block; call them off the loop."""

    dialect = POSTGRES

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        timeout_s: float = 5.0,
        allow_no_rls: bool = False,
    ) -> None:
        """Open the pool and migrate. A role that bypasses row-level security (a superuser,
        or BYPASSRLS) raises :class:`RowSecurityError` before anything is created, unless
        ``allow_no_rls`` (``LOOPSTACK_MEMORY_ALLOW_NO_RLS``): then it opens with a warning
        and ``row_security`` is False."""
        self.url = url
        self._callbacks: list[Callable[[], object]] = []
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self.row_security = True
        self._allow_no_rls = allow_no_rls
        try:
            self._pool = ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                timeout=timeout_s,
                name="loopstack-memory",
                open=False,
            )
            self._pool.open(wait=True, timeout=timeout_s)
            self._check_row_security()
            self._migrate()
        except (psycopg.Error, PoolTimeout) as exc:
            self._pool.close()
            raise LedgerError(f"cannot open ledger {redact_url(url)}: {exc}") from exc
        except RowSecurityError:
            self._pool.close()
            raise

    def describe(self) -> str:
        return redact_url(self.url)

    # --- plumbing --------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('loopstack-schema', 0))")
            conn.execute(create_table(META, POSTGRES))
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            found = version = int(row[0]) if row else 0
            check_schema_version(self.describe(), version, PG_SCHEMA_VERSION)
            if version == 0:  # a new database: the current schema at once
                conn.execute(CURRENT)
                version = PG_SCHEMA_VERSION
            for v in range(version + 1, PG_SCHEMA_VERSION + 1):
                logger.info("memory ledger %s: schema %d -> %d", self.describe(), v - 1, v)
                conn.execute(MIGRATIONS[v])
            if found != PG_SCHEMA_VERSION:
                conn.execute(
                    "INSERT INTO meta VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(PG_SCHEMA_VERSION),),
                )

    def _check_row_security(self) -> None:
        """Refuse a role that row-level security does not bind, before any table is made."""
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles "
                "WHERE rolname = current_user"
            ).fetchone()
        if row is None or not (row[1] or row[2]):
            return
        what = "a superuser" if row[1] else "a BYPASSRLS role"
        if not self._allow_no_rls:
            raise RowSecurityError(
                f"memory ledger {self.describe()}: role {row[0]!r} is {what}, so row-level "
                "security would not isolate one user's memory from another's. Connect as an "
                "ordinary role (CREATE ROLE ... NOSUPERUSER NOBYPASSRLS owning the database; "
                "deploy/k8s/agent-memory/initdb makes one), or set "
                "LOOPSTACK_MEMORY_ALLOW_NO_RLS=1 to open it anyway (isolation off)."
            )
        self.row_security = False
        logger.warning(
            "memory ledger %s: role %r is %s and LOOPSTACK_MEMORY_ALLOW_NO_RLS is set: "
            "row-level security does not apply",
            self.describe(),
            row[0],
            what,
        )

    def _rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        scope: str | None = None,
        *,
        serial: bool = False,
    ) -> list[Any]:
        """Run one read in a transaction under ``scope`` (a user id; None or ``*``: the
        maintenance scope): BEGIN, the scope and the query go out in one pipeline (one round
        trip), then COMMIT. A read on a connection that died with a server restart is
        retried once on a fresh one.
        ``serial``: no parallel workers (starting them costs more than a short read)."""
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    with conn.pipeline() as pipe:
                        conn.execute(SET_SCOPE, (ALL if scope is None else scope,))
                        if serial:
                            conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                        cur = conn.execute(sql, params)
                        pipe.sync()
                        return cur.fetchall()
            except psycopg.OperationalError as exc:
                if attempt == 2:
                    raise errors("a read")(exc) from exc
            except (psycopg.Error, PoolTimeout) as exc:
                raise errors("a read")(exc) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        self._pool.close()

    # --- wake-ups --------------------------------------------------------------------------
    def on_change(self, callback: Callable[[], object]) -> None:
        self._callbacks.append(callback)
        if self._listener is None:
            self._listener = threading.Thread(
                target=self._listen, name="memory-pg-listen", daemon=True
            )
            self._listener.start()

    def _wake(self) -> None:
        for cb in list(self._callbacks):
            try:
                cb()
            except Exception as exc:  # a down database: the next wake-up replays again
                logger.debug("memory change callback failed: %s", exc)

    def _listen(self, poll_s: float = 5.0) -> None:
        """``LISTEN`` on a connection of its own; after every (re)connect, and every
        ``poll_s`` without a notification, replay anyway (a lost notification costs at most
        ``poll_s`` of lag; readers also replay before each recall)."""
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._wake()
                    last = time.monotonic()
                    while not self._stop.is_set():
                        # A short wait: close() joins this thread (tests open hundreds of
                        # stores); each empty wait is one poll(), no traffic to the server.
                        got = sum(1 for _ in conn.notifies(timeout=0.05, stop_after=1))
                        if not got and time.monotonic() - last < poll_s:
                            continue
                        if not got:
                            conn.execute("SELECT 1")  # notices a dead server
                        self._wake()
                        last = time.monotonic()
            except psycopg.Error as exc:
                logger.info("memory change listener reconnecting: %s", exc)
                self._stop.wait(0.5)

    # --- writes ----------------------------------------------------------------------------
    def write(self) -> PostgresTransaction:
        """``with ledger.write() as tx``: one transaction under the maintenance scope until
        ``tx.lock_scope(user)`` narrows it to one user (and serialises with their writes)."""
        return PostgresTransaction(self._pool)

    def compact_changes(self, upto_seq: int) -> None:
        """Trim the log, keeping :data:`RETAIN_CHANGES` entries behind ``upto_seq``: every app
        server has its own replica, and one that lags replays instead of rebuilding."""
        upto = upto_seq - RETAIN_CHANGES
        if upto <= 0:
            return
        with self.write() as tx:
            tx.cur.execute("DELETE FROM changes WHERE seq <= %s", (upto,))
            tx.cur.execute(
                "INSERT INTO meta VALUES ('compacted_upto', %s) ON CONFLICT (key) DO UPDATE "
                "SET value = greatest(meta.value::bigint, excluded.value::bigint)::text",
                (str(upto),),
            )

    # --- reads -----------------------------------------------------------------------------
    def keyword(self, scope: Scope, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """The user's active records holding any of the query's lexemes, by how many they hold
        (``postings``: a btree, usable under row-level security), so a query costs its
        terms' postings, not the user's record count."""
        words = keyword_words(terms)
        if not words or k <= 0:
            return []
        params = keyword_params(scope, words, k)
        rows = self._rows(KEYWORD_SQL, params, scope.user_id, serial=True)
        return [(int(r[0]), float(r[1])) for r in rows]

    def max_seq(self) -> int:
        return int(self._rows("SELECT last FROM change_seq")[0][0])

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.describe(), **self._table_counts()}
        size = self._rows("SELECT pg_database_size(current_database())")[0][0]
        return {**out, "bytes": int(size), "rls": self.row_security}
