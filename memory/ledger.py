"""The SQLite ledger: the source of truth for every memory.

One file in WAL mode holds the records, their embeddings (so the FAISS index can always be
rebuilt without re-embedding), an FTS5 index for keyword recall, and an append-only change
log that the vector index replays to catch up after a crash or another process's writes.

Concurrency: one writer connection guarded by a lock (and ``BEGIN IMMEDIATE`` against other
processes); readers use their own connection per thread, and WAL lets them read the last
committed state while a write is in progress, so readers never wait for the writer.
Durability: ``synchronous=FULL``; a record is committed (and reported) only with its vector
and its change-log entry, in one transaction.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memory.embedding import Vectors
from memory.exceptions import LedgerError, SchemaVersionError
from memory.records import MemorySource, MemoryType, Record, Scope

__all__ = ["Change", "Ledger", "NewRecord", "new_id", "scope_token"]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
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
"""

_COLUMNS = (
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


@dataclass(frozen=True, slots=True)
class Change:
    seq: int
    op: str
    rowid: int
    user_id: str


def _row_to_record(row: Sequence[Any]) -> Record:
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


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


class Ledger:
    """Thread-safe access to one ledger file. All methods block; call them off the loop."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        try:
            self._writer = self._connect()
            self._writer.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) > SCHEMA_VERSION:
                raise SchemaVersionError(f"{self.path} has schema {version} > {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
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

    def close(self) -> None:
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        with self._write_lock:
            self._writer.close()

    # --- meta ------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._reader.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._write_lock:
            self._writer.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # --- writes ----------------------------------------------------------------------------
    def _tx(self) -> _Transaction:
        return _Transaction(self._writer, self._write_lock)

    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]:
        """Insert records with their vectors in one transaction; returns (id, rowid)."""
        if len(records) != len(vectors):
            raise LedgerError("one vector per record is required")
        out: list[tuple[str, int]] = []
        with self._tx() as cur:
            for rec, vec in zip(records, vectors, strict=True):
                rec.id = rec.id or new_id()
                cur.execute(
                    "INSERT INTO records (id, user_id, agent_id, session_id, text, type, source,"
                    " confidence, created_at, weight, evidence, fingerprint, scope_token)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        rec.id,
                        rec.scope.user_id,
                        rec.scope.agent_id,
                        rec.scope.session_id,
                        rec.text,
                        rec.type.value,
                        rec.source.value,
                        rec.confidence,
                        rec.created_at,
                        rec.weight,
                        json.dumps(rec.evidence),
                        rec.fingerprint,
                        scope_token(rec.scope.user_id),
                    ),
                )
                rowid = int(cur.lastrowid or 0)
                cur.execute(
                    "INSERT INTO vectors(rowid, vec) VALUES (?, ?)",
                    (rowid, np.asarray(vec, dtype=np.float32).tobytes()),
                )
                cur.execute(
                    "INSERT INTO changes(op, rowid, user_id) VALUES ('add', ?, ?)",
                    (rowid, rec.scope.user_id),
                )
                out.append((rec.id, rowid))
        return out

    def supersede(self, old: Record, new_id_: str) -> None:
        """Mark ``old`` as replaced by ``new_id_``; it leaves the vector index, not the ledger."""
        with self._tx() as cur:
            cur.execute("UPDATE records SET superseded_by = ? WHERE id = ?", (new_id_, old.id))
            cur.execute(
                "INSERT INTO changes(op, rowid, user_id) VALUES ('del', ?, ?)",
                (old.rowid, old.user_id),
            )

    def delete(self, records: Iterable[Record]) -> int:
        """Delete records for good (ledger, FTS, vectors) and log it for the index."""
        n = 0
        with self._tx() as cur:
            for rec in records:
                cur.execute("DELETE FROM records WHERE rowid = ?", (rec.rowid,))
                if rec.superseded_by is None:
                    cur.execute(
                        "INSERT INTO changes(op, rowid, user_id) VALUES ('del', ?, ?)",
                        (rec.rowid, rec.user_id),
                    )
                n += 1
        return n

    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE records SET mentions = mentions + 1 WHERE id = ?", (record_id,))
            if weight is not None:
                cur.execute(
                    "UPDATE records SET weight = max(weight, ?) WHERE id = ?", (weight, record_id)
                )

    def touch(self, usage: dict[int, tuple[int, float]]) -> None:
        """Apply buffered recall usage: rowid -> (extra hits, last used ts)."""
        if not usage:
            return
        with self._tx() as cur:
            cur.executemany(
                "UPDATE records SET hits = hits + ?,"
                " last_used_at = max(coalesce(last_used_at, 0), ?) WHERE rowid = ?",
                [(h, ts, rowid) for rowid, (h, ts) in usage.items()],
            )

    def set_weights(self, weights: dict[int, float]) -> None:
        with self._tx() as cur:
            cur.executemany(
                "UPDATE records SET weight = ? WHERE rowid = ?",
                [(w, rowid) for rowid, w in weights.items()],
            )

    def observe(
        self, user_id: str, fingerprint: str, text: str, type_: MemoryType, vec: Vectors, ts: float
    ) -> int:
        """Count one more sighting of a not-yet-kept observation; returns the new count."""
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO observations VALUES (?,?,?,?,1,?,?,?) "
                "ON CONFLICT(user_id, fingerprint) DO UPDATE SET count = count + 1, "
                "last_seen = excluded.last_seen, text = excluded.text",
                (user_id, fingerprint, text, type_.value, ts, ts, vec.tobytes()),
            )
            row = cur.execute(
                "SELECT count FROM observations WHERE user_id = ? AND fingerprint = ?",
                (user_id, fingerprint),
            ).fetchone()
        return int(row[0])

    def drop_observation(self, user_id: str, fingerprint: str) -> None:
        with self._tx() as cur:
            cur.execute(
                "DELETE FROM observations WHERE user_id = ? AND fingerprint = ?",
                (user_id, fingerprint),
            )

    def decay(
        self, now: float, half_life_days: float, prune_below: float
    ) -> tuple[int, list[Record]]:
        """Halve weights per ``half_life_days`` of disuse since the later of last use and the
        previous run; returns (records decayed, faded non-explicit records to prune)."""
        prev = float(self.get_meta("decayed_at") or 0.0)
        with self._tx() as cur:
            cur.execute(
                "UPDATE records SET weight = weight * pow(0.5, max(0.0, ? - max(created_at, "
                "coalesce(last_used_at, 0), ?)) / 86400.0 / ?) WHERE superseded_by IS NULL",
                (now, prev, half_life_days),
            )
            decayed = cur.rowcount
            rows = cur.execute(
                f"SELECT {_COLUMNS} FROM records WHERE weight < ? "
                "AND source != 'user_explicit' AND superseded_by IS NULL",
                (prune_below,),
            ).fetchall()
        self.set_meta("decayed_at", repr(now))
        return decayed, [_row_to_record(r) for r in rows]

    def compact_changes(self, upto_seq: int) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM changes WHERE seq <= ?", (upto_seq,))

    # --- reads -----------------------------------------------------------------------------
    def get(self, record_id: str) -> Record | None:
        row = self._reader.execute(
            f"SELECT {_COLUMNS} FROM records WHERE id = ?", (record_id,)
        ).fetchone()
        return None if row is None else _row_to_record(row)

    def by_rowids(self, rowids: Sequence[int], scope: Scope) -> dict[int, Record]:
        """Active records among ``rowids`` that belong to ``scope`` (the isolation check)."""
        if not rowids:
            return {}
        sql = (
            f"SELECT {_COLUMNS} FROM records WHERE rowid IN ({_placeholders(len(rowids))}) "
            "AND user_id = ? AND superseded_by IS NULL"
        )
        params: list[Any] = [*rowids, scope.user_id]
        if scope.agent_id is not None:
            sql += " AND (agent_id IS NULL OR agent_id = ?)"
            params.append(scope.agent_id)
        if scope.session_id is not None:
            sql += " AND (session_id IS NULL OR session_id = ?)"
            params.append(scope.session_id)
        rows = self._reader.execute(sql, params).fetchall()
        return {int(r[0]): _row_to_record(r) for r in rows}

    def vectors(self, rowids: Sequence[int], dim: int) -> dict[int, Vectors]:
        if not rowids:
            return {}
        rows = self._reader.execute(
            f"SELECT rowid, vec FROM vectors WHERE rowid IN ({_placeholders(len(rowids))})",
            list(rowids),
        ).fetchall()
        return {int(r[0]): np.frombuffer(r[1], dtype=np.float32, count=dim) for r in rows}

    def by_fingerprint(self, user_id: str, fingerprint: str) -> Record | None:
        row = self._reader.execute(
            f"SELECT {_COLUMNS} FROM records WHERE user_id = ? AND fingerprint = ? "
            "AND superseded_by IS NULL LIMIT 1",
            (user_id, fingerprint),
        ).fetchone()
        return None if row is None else _row_to_record(row)

    def list_records(
        self, user_id: str, *, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]:
        sql = f"SELECT {_COLUMNS} FROM records WHERE user_id = ?"
        if not include_superseded:
            sql += " AND superseded_by IS NULL"
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
        rows = self._reader.execute(sql, (user_id, limit, offset)).fetchall()
        return [_row_to_record(r) for r in rows]

    def predecessors(self, record_id: str) -> list[Record]:
        """Records this one superseded, newest first (the audit chain)."""
        out: list[Record] = []
        seen = {record_id}
        frontier = [record_id]
        while frontier:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM records WHERE superseded_by IN "
                f"({_placeholders(len(frontier))}) ORDER BY created_at DESC",
                frontier,
            ).fetchall()
            frontier = []
            for r in rows:
                rec = _row_to_record(r)
                if rec.id not in seen:
                    seen.add(rec.id)
                    out.append(rec)
                    frontier.append(rec.id)
        return out

    def keyword(self, scope: Scope, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """BM25 over FTS5, restricted to the user by the scope token; (rowid, bm25) pairs
        with bm25 made positive (higher is better)."""
        if not terms or k <= 0:
            return []
        quoted = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        match = f'scope_token : "{scope_token(scope.user_id)}" AND ({quoted})'
        # Superseded records are not in the FTS index (trigger records_au).
        rows = self._reader.execute(
            "SELECT rowid, rank FROM records_fts WHERE records_fts MATCH ? "
            "AND rank MATCH 'bm25(1.0, 0.0)' ORDER BY rank LIMIT ?",
            (match, k),
        ).fetchall()
        return [(int(r[0]), -float(r[1])) for r in rows]

    def doc_freq(self, terms: Sequence[str]) -> dict[str, int]:
        """Documents containing each (already stemmed, lower-case) term, over all users."""
        if not terms:
            return {}
        rows = self._reader.execute(
            f"SELECT term, doc FROM records_vocab WHERE term IN ({_placeholders(len(terms))})",
            list(terms),
        ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def count(self, user_id: str | None = None, *, active_only: bool = True) -> int:
        sql = "SELECT count(*) FROM records WHERE 1=1"
        params: list[Any] = []
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        if active_only:
            sql += " AND superseded_by IS NULL"
        return int(self._reader.execute(sql, params).fetchone()[0])

    def observations(self, user_id: str) -> list[tuple[str, str, int, Vectors]]:
        rows = self._reader.execute(
            "SELECT fingerprint, text, count, vec FROM observations WHERE user_id = ?", (user_id,)
        ).fetchall()
        return [(r[0], r[1], int(r[2]), np.frombuffer(r[3], dtype=np.float32)) for r in rows]

    def max_seq(self) -> int:
        row = self._reader.execute("SELECT max(seq) FROM changes").fetchone()
        if row[0] is None:
            row = self._reader.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'changes'"
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def changes_since(self, seq: int) -> list[Change]:
        rows = self._reader.execute(
            "SELECT seq, op, rowid, user_id FROM changes WHERE seq > ? ORDER BY seq", (seq,)
        ).fetchall()
        return [Change(int(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]

    def active_vectors(self, dim: int, batch: int = 50_000) -> Iterator[tuple[str, Any, Vectors]]:
        """(user_id, rowids, vectors) batches of every active record, for a rebuild."""
        last = 0
        while True:
            rows = self._reader.execute(
                "SELECT r.rowid, r.user_id, v.vec FROM records r JOIN vectors v "
                "ON v.rowid = r.rowid WHERE r.rowid > ? AND r.superseded_by IS NULL "
                "ORDER BY r.rowid LIMIT ?",
                (last, batch),
            ).fetchall()
            if not rows:
                return
            last = int(rows[-1][0])
            by_user: dict[str, list[tuple[int, bytes]]] = {}
            for rowid, user_id, blob in rows:
                by_user.setdefault(user_id, []).append((int(rowid), blob))
            for user_id, items in by_user.items():
                ids = np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))
                vecs = np.frombuffer(b"".join(b for _, b in items), dtype=np.float32)
                yield user_id, ids, vecs.reshape(len(items), dim)

    def stats(self) -> dict[str, Any]:
        q = self._reader.execute
        return {
            "path": str(self.path),
            "records": int(q("SELECT count(*) FROM records").fetchone()[0]),
            "active": int(
                q("SELECT count(*) FROM records WHERE superseded_by IS NULL").fetchone()[0]
            ),
            "users": int(q("SELECT count(DISTINCT user_id) FROM records").fetchone()[0]),
            "observations": int(q("SELECT count(*) FROM observations").fetchone()[0]),
            "pending_changes": int(q("SELECT count(*) FROM changes").fetchone()[0]),
            "bytes": self.path.stat().st_size if self.path.exists() else 0,
        }


class _Transaction:
    """``with ledger._tx() as cur``: BEGIN IMMEDIATE under the write lock, COMMIT or ROLLBACK."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock

    def __enter__(self) -> sqlite3.Cursor:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise LedgerError(f"cannot start a write: {exc}") from exc
        return self._conn.cursor()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                self._conn.execute("COMMIT")
            else:
                self._conn.execute("ROLLBACK")
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise LedgerError(str(exc)) from exc
