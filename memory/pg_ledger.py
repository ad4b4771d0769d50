"""The Postgres ledger: one database shared by every app server (``LOOPSTACK_MEMORY_URL``).

The same contract as the SQLite ledger (``memory.backend.LedgerBackend``) on psycopg 3 with
a connection pool. Each app server keeps its own FAISS replica (``memory.replica``) caught
up from the shared change log; a listener connection (``LISTEN loopstack_memory``) wakes it
when another server commits, and the replay of the log after a reconnect (or a periodic
poll) makes up for any notification lost.

Concurrency: a writing transaction of one user takes a transaction-scoped advisory lock
keyed by the user (``lock_scope``), so the writer's duplicate and supersede decisions are
taken on every earlier commit of that user, on whatever server it was made, and two servers
adding the same fact cannot both insert it; writes of different users never wait for each
other (except for the few microseconds of the change-log counter at commit).

Isolation: every transaction sets ``loopstack.user_id`` (``SET LOCAL``) and row-level
security (``memory.pg_schema``) limits what its queries can see to that user's rows.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from memory.backend import WriteShortcuts, group_by_user, redact_url
from memory.embedding import Vectors
from memory.exceptions import LedgerError, RowSecurityError, SchemaVersionError
from memory.pg_schema import ALL, CHANNEL, MIGRATIONS, PG_SCHEMA_VERSION, SET_SCOPE
from memory.pg_tx import PgTransaction, errors
from memory.records import MemoryType, Record, Scope, TrustEvent
from memory.schema import (
    COLUMNS,
    STATS_SQL,
    Change,
    event_from_row,
    row_to_record,
)

__all__ = ["KEYWORD_SQL", "PgLedger", "keyword_params", "keyword_words"]

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


class PgLedger(WriteShortcuts):
    """Thread-safe access to one Postgres database. All methods block; call them off the loop."""

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
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > PG_SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.describe()} has schema {version} > {PG_SCHEMA_VERSION}"
                )
            for v in range(version + 1, PG_SCHEMA_VERSION + 1):
                conn.execute(MIGRATIONS[v])
                conn.execute(
                    "INSERT INTO meta VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(v),),
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
        self, sql: str, params: Sequence[Any] = (), scope: str = ALL, *, serial: bool = False
    ) -> list[Any]:
        """Run one read in a transaction under ``scope`` (a user id, or ``*``): BEGIN, the
        scope and the query go out in one pipeline (one round trip), then COMMIT. A read on
        a connection that died with a server restart is retried once on a fresh one.
        ``serial``: no parallel workers (starting them costs more than a short read)."""
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    with conn.pipeline() as pipe:
                        conn.execute(SET_SCOPE, (scope,))
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

    # --- meta ------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key = %s", (key,))
        return None if not rows else str(rows[0][0])

    def set_meta(self, key: str, value: str) -> None:
        with self.write() as tx:
            tx.cur.execute(
                "INSERT INTO meta(key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # --- writes ----------------------------------------------------------------------------
    def write(self) -> PgTransaction:
        """``with ledger.write() as tx``: one transaction under the maintenance scope until
        ``tx.lock_scope(user)`` narrows it to one user (and serialises with their writes)."""
        return PgTransaction(self._pool)

    def touch(self, usage: dict[int, tuple[int, float]]) -> None:
        if not usage:
            return
        with self.write() as tx:
            tx.cur.executemany(
                "UPDATE records SET hits = hits + %s,"
                " last_used_at = greatest(coalesce(last_used_at, 0), %s) WHERE rowid = %s",
                [(h, ts, rowid) for rowid, (h, ts) in sorted(usage.items())],
            )

    def observe(
        self, user_id: str, fingerprint: str, text: str, type_: MemoryType, vec: Vectors, ts: float
    ) -> int:
        with self.write() as tx:
            tx.lock_scope(user_id)
            tx.cur.execute(
                "INSERT INTO observations VALUES (%s,%s,%s,%s,1,%s,%s,%s) "
                "ON CONFLICT (user_id, fingerprint) DO UPDATE SET "
                "count = observations.count + 1, last_seen = excluded.last_seen, "
                "text = excluded.text RETURNING count",
                (user_id, fingerprint, text, type_.value, ts, ts, vec.tobytes()),
            )
            row = tx.cur.fetchone()
        return int(row[0]) if row else 0

    def drop_observation(self, user_id: str, fingerprint: str) -> None:
        with self.write() as tx:
            tx.lock_scope(user_id)
            tx.cur.execute(
                "DELETE FROM observations WHERE user_id = %s AND fingerprint = %s",
                (user_id, fingerprint),
            )

    def decay(
        self, now: float, half_life_days: float, prune_below: float
    ) -> tuple[int, list[Record]]:
        prev = float(self.get_meta("decayed_at") or 0.0)
        with self.write() as tx:
            tx.cur.execute(
                "UPDATE records SET weight = weight * power(0.5, greatest(0.0, %s - greatest("
                "created_at, coalesce(last_used_at, 0), %s)) / 86400.0 / %s) "
                "WHERE superseded_by IS NULL",
                (now, prev, half_life_days),
            )
            decayed = tx.cur.rowcount
            tx.cur.execute(
                f"SELECT {COLUMNS} FROM records WHERE weight < %s "
                "AND source != 'user_explicit' AND superseded_by IS NULL",
                (prune_below,),
            )
            rows = tx.cur.fetchall()
        self.set_meta("decayed_at", repr(now))
        return decayed, [row_to_record(r) for r in rows]

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

    def set_vectors(self, pairs: Sequence[tuple[int, Vectors]]) -> None:
        with self.write() as tx:
            tx.cur.executemany(
                "UPDATE vectors SET vec = %s WHERE rowid = %s",
                [(np.asarray(v, dtype=np.float32).tobytes(), r) for r, v in pairs],
            )

    # --- reads -----------------------------------------------------------------------------
    def get(self, record_id: str) -> Record | None:
        rows = self._rows(f"SELECT {COLUMNS} FROM records WHERE id = %s", (record_id,))
        return row_to_record(rows[0]) if rows else None

    def by_rowids(self, rowids: Sequence[int], scope: Scope) -> dict[int, Record]:
        if not rowids:
            return {}
        sql = (
            f"SELECT {COLUMNS} FROM records WHERE rowid = ANY(%s) "
            "AND user_id = %s AND superseded_by IS NULL"
        )
        params: list[Any] = [list(rowids), scope.user_id]
        if scope.agent_id is not None:
            sql += " AND (agent_id IS NULL OR agent_id = %s)"
            params.append(scope.agent_id)
        if scope.session_id is not None:
            sql += " AND (session_id IS NULL OR session_id = %s)"
            params.append(scope.session_id)
        rows = self._rows(sql, params, scope.user_id)
        return {int(r[0]): row_to_record(r) for r in rows}

    def vectors(self, rowids: Sequence[int], dim: int) -> dict[int, Vectors]:
        if not rowids:
            return {}
        rows = self._rows("SELECT rowid, vec FROM vectors WHERE rowid = ANY(%s)", (list(rowids),))
        return {int(r[0]): np.frombuffer(r[1], dtype=np.float32, count=dim) for r in rows}

    def by_fingerprint(self, user_id: str, fingerprint: str) -> Record | None:
        rows = self._rows(
            f"SELECT {COLUMNS} FROM records WHERE user_id = %s AND fingerprint = %s "
            "AND superseded_by IS NULL ORDER BY rowid LIMIT 1",
            (user_id, fingerprint),
            user_id,
        )
        return row_to_record(rows[0]) if rows else None

    def list_records(
        self, user_id: str, *, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]:
        sql = f"SELECT {COLUMNS} FROM records WHERE user_id = %s"
        if not include_superseded:
            sql += " AND superseded_by IS NULL"
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT %s OFFSET %s"
        return [row_to_record(r) for r in self._rows(sql, (user_id, limit, offset), user_id)]

    def predecessors(self, record_id: str) -> list[Record]:
        out: list[Record] = []
        seen = {record_id}
        frontier = [record_id]
        while frontier:
            rows = self._rows(
                f"SELECT {COLUMNS} FROM records WHERE superseded_by = ANY(%s) "
                "ORDER BY created_at DESC",
                (frontier,),
            )
            frontier = []
            for r in rows:
                rec = row_to_record(r)
                if rec.id not in seen:
                    seen.add(rec.id)
                    out.append(rec)
                    frontier.append(rec.id)
        return out

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

    def doc_freq(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        if not terms:
            return {}
        rows = self._rows(
            "SELECT term, df FROM user_terms WHERE user_id = %s AND term = ANY(%s)",
            (user_id, list(terms)),
            user_id,
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def events(self, record_ids: Sequence[str]) -> dict[str, list[TrustEvent]]:
        if not record_ids:
            return {}
        rows = self._rows(
            "SELECT record_id, ts, kind, detail FROM events WHERE record_id = ANY(%s) "
            "ORDER BY ts, seq",
            (list(record_ids),),
        )
        out: dict[str, list[TrustEvent]] = {}
        for r in rows:
            out.setdefault(str(r[0]), []).append(event_from_row(r[1:]))
        return out

    def active_rowids(self, rowids: Sequence[int]) -> list[int]:
        if not rowids:
            return []
        rows = self._rows(
            "SELECT rowid FROM records WHERE superseded_by IS NULL AND rowid = ANY(%s)",
            (list(rowids),),
        )
        return [int(r[0]) for r in rows]

    def texts_after(self, rowid: int, limit: int = 512) -> list[tuple[int, str]]:
        rows = self._rows(
            "SELECT rowid, text FROM records WHERE rowid > %s ORDER BY rowid LIMIT %s",
            (rowid, limit),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def count(self, user_id: str | None = None, *, active_only: bool = True) -> int:
        sql = "SELECT count(*) FROM records WHERE true"
        params: list[Any] = []
        if user_id is not None:
            sql += " AND user_id = %s"
            params.append(user_id)
        if active_only:
            sql += " AND superseded_by IS NULL"
        return int(self._rows(sql, params, user_id or ALL)[0][0])

    def observations(self, user_id: str) -> list[tuple[str, str, int, Vectors]]:
        rows = self._rows(
            "SELECT fingerprint, text, count, vec FROM observations WHERE user_id = %s",
            (user_id,),
            user_id,
        )
        return [(r[0], r[1], int(r[2]), np.frombuffer(r[3], dtype=np.float32)) for r in rows]

    def max_seq(self) -> int:
        return int(self._rows("SELECT last FROM change_seq")[0][0])

    def changes_since(self, seq: int) -> list[Change]:
        rows = self._rows(
            "SELECT seq, op, rowid, user_id FROM changes WHERE seq > %s ORDER BY seq", (seq,)
        )
        return [Change(int(r[0]), r[1], int(r[2]), str(r[3])) for r in rows]

    def active_vectors(self, dim: int, batch: int = 50_000) -> Iterator[tuple[str, Any, Vectors]]:
        last = 0
        while True:
            rows = self._rows(
                "SELECT r.rowid, r.user_id, v.vec FROM records r JOIN vectors v "
                "ON v.rowid = r.rowid WHERE r.rowid > %s AND r.superseded_by IS NULL "
                "ORDER BY r.rowid LIMIT %s",
                (last, batch),
            )
            if not rows:
                return
            last = int(rows[-1][0])
            yield from group_by_user(rows, dim)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: int(self._rows(sql)[0][0]) for k, sql in STATS_SQL.items()}
        size = self._rows("SELECT pg_database_size(current_database())")[0][0]
        return {"path": self.describe(), **out, "bytes": int(size), "rls": self.row_security}
