"""The SQLite ledger: the embedded default, one database file per store.

One file in WAL mode holds the records, their embeddings (so the FAISS index can always be
rebuilt without re-embedding), an FTS5 index for keyword recall, and an append-only change
log that the vector index replays to catch up after a crash or another process's writes.

Tables: ``records`` (one row per memory, superseded versions kept), ``vectors`` (the
float32 embedding of each record), ``records_fts`` (FTS5 with a per-user scope token),
``changes`` (the append-only log the vector index replays), ``observations`` (facts seen but
not yet promoted), ``events`` (trust events: confirmed / contradicted, the verification
path's history), ``user_terms`` (per-user keyword document frequencies) and ``meta``.

Concurrency: one writer connection guarded by a lock (and ``BEGIN IMMEDIATE`` against other
processes); readers use their own connection per thread, and WAL lets them read the last
committed state while a write is in progress, so readers never wait for the writer.
Durability: ``synchronous=FULL``; a record is committed (and reported) only with its vector
and its change-log entry, in one transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from loopstack.memory.embedding import Vectors
from loopstack.memory.exceptions import LedgerBusyError, LedgerError, LedgerLockedError
from loopstack.memory.ledger.common import SqlLedger, SqlTx
from loopstack.memory.ledger.rows import (
    COLUMNS,
    INSERT_COLUMNS,
    SQLITE,
    NewRecord,
    check_schema_version,
    check_vectors,
    insert_values,
    row_to_record,
    texts_by_user,
)
from loopstack.memory.ledger.schema import EVENTS, META, create_indexes, create_table, tables_of
from loopstack.memory.pipeline import doc_terms
from loopstack.memory.records import Record, Scope

__all__ = [
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SqliteLedger",
    "SqliteTx",
    "ledger_error",
    "scope_token",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2

#: What is SQLite's own beside the declared tables: the FTS5 keyword index, the triggers
#: that keep it (and the vectors) in step with ``records``.
_FTS = """
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
"""

#: The current schema: the declared tables (``loopstack.memory.ledger.schema``) and SQLite's own.
SCHEMA = "".join(create_table(t, SQLITE) + create_indexes(t) for t in tables_of("sqlite")) + _FTS

#: version -> the statements that bring a file of the previous version to it (run once, in
#: order, in the transaction that opens the file; ``SCHEMA`` then adds what is missing).
MIGRATIONS: dict[int, str] = {
    # 2: events carry their owner (``user_id``, as on Postgres) and an explicit ``seq`` (the
    # old implicit rowid, kept); meta's key is NOT NULL. Both tables are rebuilt; an event
    # whose record is gone keeps an empty owner.
    2: "ALTER TABLE meta RENAME TO meta_v1;\n"
    + create_table(META, SQLITE)
    + "INSERT INTO meta(key, value) SELECT key, value FROM meta_v1 WHERE key IS NOT NULL;\n"
    "DROP TABLE meta_v1;\n"
    "ALTER TABLE events RENAME TO events_v1;\n"
    + create_table(EVENTS, SQLITE)
    + "INSERT INTO events(seq, record_id, user_id, ts, kind, detail)\n"
    "SELECT e.rowid, e.record_id, coalesce(r.user_id, ''), e.ts, e.kind, e.detail\n"
    "FROM events_v1 e LEFT JOIN records r ON r.id = e.record_id ORDER BY e.rowid;\n"
    "DROP TABLE events_v1;\n",
}


def _statements(script: str) -> list[str]:
    """The statements of ``script`` (a trigger's body stays whole)."""
    out: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current)
            current = ""
    return out


#: The ledger error for each of SQLite's primary result codes that has a type of its own.
_BY_CODE: dict[int, type[LedgerError]] = {
    sqlite3.SQLITE_BUSY: LedgerBusyError,
    sqlite3.SQLITE_LOCKED: LedgerLockedError,
}
_CONTENTION = (LedgerBusyError, LedgerLockedError)


def ledger_error(exc: sqlite3.Error, prefix: str = "") -> LedgerError:
    """``exc`` as a ledger error, typed by SQLite's result code (``sqlite_errorcode``; its
    low byte is the primary code, so ``SQLITE_BUSY_SNAPSHOT`` is a busy error too), never by
    the text of its message."""
    code = getattr(exc, "sqlite_errorcode", None)
    kind = _BY_CODE.get(code & 0xFF, LedgerError) if isinstance(code, int) else LedgerError
    return kind(f"{prefix}{exc}")


def scope_token(user_id: str) -> str:
    """An FTS token that stands for the user, so keyword recall intersects with it."""
    return "u" + uuid.uuid5(uuid.NAMESPACE_URL, "loopstack-user:" + user_id).hex


class SqliteLedger(SqlLedger):
    """Thread-safe access to one SQLite ledger file. All methods block; call them off the
    loop."""

    dialect = SQLITE

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        try:
            self._writer = self._connect()
            self._open_schema()
            self._build_user_terms()
        except sqlite3.Error as exc:
            raise ledger_error(exc, f"cannot open ledger {self.path}: ") from exc

    def _open_schema(self) -> None:
        """Create a new file's tables, or bring an older file's to :data:`SCHEMA_VERSION`
        (every row kept), in one ``BEGIN IMMEDIATE`` transaction: another process opening
        the file meanwhile waits, then finds it current. A newer file is refused."""
        with self.write() as tx:
            found = _stored_version(tx)
            if found is not None:
                check_schema_version(str(self.path), found, SCHEMA_VERSION)
                for v in range(found + 1, SCHEMA_VERSION + 1):
                    logger.info("memory ledger %s: schema %d -> %d", self.path, v - 1, v)
                    for sql in _statements(MIGRATIONS[v]):
                        tx.cur.execute(sql)
            for sql in _statements(SCHEMA):
                tx.cur.execute(sql)
            if found != SCHEMA_VERSION:
                tx.cur.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (str(SCHEMA_VERSION),),
                )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        # Switching a new file to WAL while another process holds it answers SQLITE_BUSY
        # ("database is locked") at once, without SQLite's busy handler (two processes opening
        # one new store together): retried for as long as the busy timeout would have waited.
        deadline = time.monotonic() + 30.0
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if not isinstance(ledger_error(exc), _CONTENTION) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    @property
    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=1")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        scope: str | None = None,
        *,
        serial: bool = False,
    ) -> list[Any]:
        """One read on this thread's connection (SQLite has no per-user scope to set)."""
        return self._reader.execute(sql, params).fetchall()

    def describe(self) -> str:
        return str(self.path)

    def on_change(self, callback: Callable[[], object]) -> None:
        """SQLite cannot tell: readers replay the change log before each recall."""

    def close(self) -> None:
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        with self._write_lock:
            self._writer.close()

    # --- writes ----------------------------------------------------------------------------
    def write(self) -> _Transaction:
        """``with ledger.write() as tx``: one ``BEGIN IMMEDIATE`` transaction. Reads through
        ``tx`` see every commit of every process (no one else can commit meanwhile), so
        decisions taken on them (duplicate, supersede) hold when the transaction commits."""
        return _Transaction(self._writer, self._write_lock)

    def compact_changes(self, upto_seq: int) -> None:
        """Trim the log through ``upto_seq``; ``compacted_upto`` rises (never falls) with it."""
        with self.write() as tx:
            tx.cur.execute("DELETE FROM changes WHERE seq <= ?", (upto_seq,))
            tx.cur.execute(
                "INSERT INTO meta VALUES ('compacted_upto', ?) ON CONFLICT(key) DO UPDATE "
                "SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                (str(upto_seq),),
            )

    def _build_user_terms(self) -> None:
        """Per-user keyword statistics for a ledger written before they existed (once)."""
        if self.get_meta("user_terms") == "1":
            return
        with self.write() as tx:
            tx.cur.execute("DELETE FROM user_terms")
            rows = tx.cur.execute(
                "SELECT user_id, text FROM records WHERE superseded_by IS NULL"
            ).fetchall()
            by_user: dict[str, list[str]] = {}
            for user_id, text in rows:
                by_user.setdefault(str(user_id), []).append(str(text))
            for uid, texts in by_user.items():
                tx.count_terms(uid, texts, +1)
            tx.cur.execute(
                "INSERT INTO meta(key, value) VALUES ('user_terms', '1') "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
            )

    # --- reads -----------------------------------------------------------------------------
    def keyword(self, scope: Scope, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """BM25 over FTS5, restricted to the user by the scope token; (rowid, bm25) pairs
        with bm25 made positive (higher is better)."""
        if not terms or k <= 0:
            return []
        quoted = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        match = f'scope_token : "{scope_token(scope.user_id)}" AND ({quoted})'
        # Superseded records are not in the FTS index (trigger records_au).
        rows = self._rows(
            "SELECT rowid, rank FROM records_fts WHERE records_fts MATCH ? "
            "AND rank MATCH 'bm25(1.0, 0.0)' ORDER BY rank LIMIT ?",
            (match, k),
        )
        return [(int(r[0]), -float(r[1])) for r in rows]

    def max_seq(self) -> int:
        row = self._reader.execute("SELECT max(seq) FROM changes").fetchone()
        if row[0] is None:
            row = self._reader.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'changes'"
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def stats(self) -> dict[str, Any]:
        size = self.path.stat().st_size if self.path.exists() else 0
        return {"path": str(self.path), **self._table_counts(), "bytes": size}


class SqliteTx(SqlTx):
    """Writes (and the reads decisions need) inside one SQLite transaction: every statement
    runs as it comes."""

    dialect = SQLITE

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.cur.execute(sql, params).rowcount

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.cur.execute(sql, params).fetchall()

    def many(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        self.cur.executemany(sql, params)

    def send(self, sql: str, params: Sequence[Any]) -> None:
        self.cur.execute(sql, params)

    def log_change(self, op: Literal["add", "del"], rowid: int, user_id: str) -> None:
        self.cur.execute(
            "INSERT INTO changes(op, rowid, user_id) VALUES (?, ?, ?)", (op, rowid, user_id)
        )

    def lock_scope(self, user_id: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already serialises every write of the file."""

    def by_fingerprints(self, user_id: str, fingerprints: Sequence[str]) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for i in range(0, len(fingerprints), SQLITE.max_in):
            cond, params = SQLITE.any_of("fingerprint", fingerprints[i : i + SQLITE.max_in])
            for row in self.cur.execute(
                f"SELECT fingerprint, {COLUMNS} FROM records WHERE user_id = ? AND {cond} "
                "AND superseded_by IS NULL ORDER BY rowid",
                [user_id, *params],
            ):
                out.setdefault(str(row[0]), row_to_record(row[1:]))
        return out

    def count_terms(self, user_id: str, texts: Sequence[str], delta: int) -> None:
        """Per-user keyword document frequencies (so pruning never sees other users)."""
        counts: dict[str, int] = {}
        for terms in doc_terms(texts):
            for t in terms:
                counts[t] = counts.get(t, 0) + delta
        self.cur.executemany(
            "INSERT INTO user_terms(user_id, term, df) VALUES (?, ?, max(?, 0)) "
            "ON CONFLICT(user_id, term) DO UPDATE SET df = max(df + ?, 0)",
            [(user_id, t, d, d) for t, d in counts.items()],
        )

    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]:
        check_vectors(records, vectors)
        out: list[tuple[str, int]] = []
        cur = self.cur
        for rec, vec in zip(records, vectors, strict=True):
            cur.execute(
                f"INSERT INTO records ({INSERT_COLUMNS}, scope_token) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (*insert_values(rec), scope_token(rec.scope.user_id)),
            )
            rowid = int(cur.lastrowid or 0)
            cur.execute(
                "INSERT INTO vectors(rowid, vec) VALUES (?, ?)",
                (rowid, np.asarray(vec, dtype=np.float32).tobytes()),
            )
            self.log_change("add", rowid, rec.scope.user_id)
            out.append((rec.id, rowid))
        for user_id, texts in texts_by_user(records).items():
            self.count_terms(user_id, texts, +1)
        return out


def _stored_version(tx: SqliteTx) -> int | None:
    """The file's schema version; None for a new (empty) file. A file of the first release
    that has tables but no version yet (it stopped while opening) is version 1."""
    tables = {str(r[0]) for r in tx.fetch("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" in tables:
        rows = tx.fetch("SELECT value FROM meta WHERE key = 'schema_version'")
        if rows:
            return int(rows[0][0])
    return 1 if "records" in tables else None


class _Transaction:
    """``with ledger.write() as tx``: BEGIN IMMEDIATE under the write lock, COMMIT or ROLLBACK."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock

    def __enter__(self) -> SqliteTx:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise ledger_error(exc, "cannot start a write: ") from exc
        return SqliteTx(self._conn.cursor())

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                self._conn.execute("COMMIT")
            else:
                self._conn.execute("ROLLBACK")
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise ledger_error(exc) from exc
