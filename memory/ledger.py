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
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory.backend import WriteShortcuts, group_by_user
from memory.embedding import Vectors
from memory.exceptions import LedgerError, SchemaVersionError
from memory.pipeline import doc_terms
from memory.records import EventKind, MemoryType, Record, Scope, TrustEvent
from memory.schema import (
    COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    STATS_SQL,
    Change,
    NewRecord,
    event_from_row,
    new_id,
    placeholders,
    row_to_record,
    scope_token,
)

__all__ = ["Change", "Ledger", "NewRecord", "Tx", "new_id", "scope_token"]

logger = logging.getLogger(__name__)


class Ledger(WriteShortcuts):
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
            self._writer.executescript(SCHEMA)
            version = self.get_meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) > SCHEMA_VERSION:
                raise SchemaVersionError(f"{self.path} has schema {version} > {SCHEMA_VERSION}")
            self._build_user_terms()
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
    def write(self) -> _Transaction:
        """``with ledger.write() as tx``: one ``BEGIN IMMEDIATE`` transaction. Reads through
        ``tx`` see every commit of every process (no one else can commit meanwhile), so
        decisions taken on them (duplicate, supersede) hold when the transaction commits."""
        return _Transaction(self._writer, self._write_lock)

    def touch(self, usage: dict[int, tuple[int, float]]) -> None:
        """Apply buffered recall usage: rowid -> (extra hits, last used ts)."""
        if not usage:
            return
        with self.write() as tx:
            tx.cur.executemany(
                "UPDATE records SET hits = hits + ?,"
                " last_used_at = max(coalesce(last_used_at, 0), ?) WHERE rowid = ?",
                [(h, ts, rowid) for rowid, (h, ts) in usage.items()],
            )

    def observe(
        self, user_id: str, fingerprint: str, text: str, type_: MemoryType, vec: Vectors, ts: float
    ) -> int:
        """Count one more sighting of a not-yet-kept observation; returns the new count."""
        with self.write() as tx:
            tx.cur.execute(
                "INSERT INTO observations VALUES (?,?,?,?,1,?,?,?) "
                "ON CONFLICT(user_id, fingerprint) DO UPDATE SET count = count + 1, "
                "last_seen = excluded.last_seen, text = excluded.text",
                (user_id, fingerprint, text, type_.value, ts, ts, vec.tobytes()),
            )
            row = tx.cur.execute(
                "SELECT count FROM observations WHERE user_id = ? AND fingerprint = ?",
                (user_id, fingerprint),
            ).fetchone()
        return int(row[0])

    def drop_observation(self, user_id: str, fingerprint: str) -> None:
        with self.write() as tx:
            tx.cur.execute(
                "DELETE FROM observations WHERE user_id = ? AND fingerprint = ?",
                (user_id, fingerprint),
            )

    def decay(
        self, now: float, half_life_days: float, prune_below: float
    ) -> tuple[int, list[Record]]:
        """Halve weights per ``half_life_days`` of disuse since the later of last use and the
        previous run; returns (records decayed, faded non-explicit records to prune)."""
        prev = float(self.get_meta("decayed_at") or 0.0)
        with self.write() as tx:
            tx.cur.execute(
                "UPDATE records SET weight = weight * pow(0.5, max(0.0, ? - max(created_at, "
                "coalesce(last_used_at, 0), ?)) / 86400.0 / ?) WHERE superseded_by IS NULL",
                (now, prev, half_life_days),
            )
            decayed = tx.cur.rowcount
            rows = tx.cur.execute(
                f"SELECT {COLUMNS} FROM records WHERE weight < ? "
                "AND source != 'user_explicit' AND superseded_by IS NULL",
                (prune_below,),
            ).fetchall()
        self.set_meta("decayed_at", repr(now))
        return decayed, [row_to_record(r) for r in rows]

    def compact_changes(self, upto_seq: int) -> None:
        """Trim the log through ``upto_seq``; ``compacted_upto`` rises (never falls) with it."""
        with self.write() as tx:
            tx.cur.execute("DELETE FROM changes WHERE seq <= ?", (upto_seq,))
            tx.cur.execute(
                "INSERT INTO meta VALUES ('compacted_upto', ?) ON CONFLICT(key) DO UPDATE "
                "SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                (str(upto_seq),),
            )

    def set_vectors(self, pairs: Sequence[tuple[int, Vectors]]) -> None:
        """Replace stored vectors (re-embedding): (rowid, vector) pairs."""
        with self.write() as tx:
            tx.cur.executemany(
                "UPDATE vectors SET vec = ? WHERE rowid = ?",
                [(np.asarray(v, dtype=np.float32).tobytes(), r) for r, v in pairs],
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
    def get(self, record_id: str) -> Record | None:
        row = self._reader.execute(
            f"SELECT {COLUMNS} FROM records WHERE id = ?", (record_id,)
        ).fetchone()
        return None if row is None else row_to_record(row)

    def by_rowids(self, rowids: Sequence[int], scope: Scope) -> dict[int, Record]:
        """Active records among ``rowids`` that belong to ``scope`` (the isolation check)."""
        if not rowids:
            return {}
        sql = (
            f"SELECT {COLUMNS} FROM records WHERE rowid IN ({placeholders(len(rowids))}) "
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
        return {int(r[0]): row_to_record(r) for r in rows}

    def vectors(self, rowids: Sequence[int], dim: int) -> dict[int, Vectors]:
        if not rowids:
            return {}
        rows = self._reader.execute(
            f"SELECT rowid, vec FROM vectors WHERE rowid IN ({placeholders(len(rowids))})",
            list(rowids),
        ).fetchall()
        return {int(r[0]): np.frombuffer(r[1], dtype=np.float32, count=dim) for r in rows}

    def by_fingerprint(self, user_id: str, fingerprint: str) -> Record | None:
        row = self._reader.execute(
            f"SELECT {COLUMNS} FROM records WHERE user_id = ? AND fingerprint = ? "
            "AND superseded_by IS NULL LIMIT 1",
            (user_id, fingerprint),
        ).fetchone()
        return None if row is None else row_to_record(row)

    def list_records(
        self, user_id: str, *, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]:
        sql = f"SELECT {COLUMNS} FROM records WHERE user_id = ?"
        if not include_superseded:
            sql += " AND superseded_by IS NULL"
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
        rows = self._reader.execute(sql, (user_id, limit, offset)).fetchall()
        return [row_to_record(r) for r in rows]

    def predecessors(self, record_id: str) -> list[Record]:
        """Records this one superseded, newest first (the audit chain)."""
        out: list[Record] = []
        seen = {record_id}
        frontier = [record_id]
        while frontier:
            rows = self._reader.execute(
                f"SELECT {COLUMNS} FROM records WHERE superseded_by IN "
                f"({placeholders(len(frontier))}) ORDER BY created_at DESC",
                frontier,
            ).fetchall()
            frontier = []
            for r in rows:
                rec = row_to_record(r)
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

    def doc_freq(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        """This user's active records containing each (stemmed, lower-case) term. Per user, so
        one tenant's data never changes which terms another tenant's queries keep."""
        if not terms:
            return {}
        rows = self._reader.execute(
            f"SELECT term, df FROM user_terms WHERE user_id = ? "
            f"AND term IN ({placeholders(len(terms))})",
            [user_id, *terms],
        ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def events(self, record_ids: Sequence[str]) -> dict[str, list[TrustEvent]]:
        """Trust events (confirmed / contradicted) of each record, oldest first."""
        if not record_ids:
            return {}
        rows = self._reader.execute(
            f"SELECT record_id, ts, kind, detail FROM events WHERE record_id IN "
            f"({placeholders(len(record_ids))}) ORDER BY ts, rowid",
            list(record_ids),
        ).fetchall()
        out: dict[str, list[TrustEvent]] = {}
        for r in rows:
            out.setdefault(str(r[0]), []).append(event_from_row(r[1:]))
        return out

    def active_rowids(self, rowids: Sequence[int]) -> list[int]:
        """Those of ``rowids`` whose records are still active (not superseded or deleted)."""
        out: list[int] = []
        for i in range(0, len(rowids), 900):
            chunk = list(rowids[i : i + 900])
            rows = self._reader.execute(
                "SELECT rowid FROM records WHERE superseded_by IS NULL AND rowid IN "
                f"({placeholders(len(chunk))})",
                chunk,
            ).fetchall()
            out.extend(int(r[0]) for r in rows)
        return out

    def texts_after(self, rowid: int, limit: int = 512) -> list[tuple[int, str]]:
        """(rowid, text) of records after ``rowid`` in rowid order (re-embedding batches)."""
        rows = self._reader.execute(
            "SELECT rowid, text FROM records WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (rowid, limit),
        ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

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
        return [Change(int(r[0]), r[1], int(r[2]), str(r[3])) for r in rows]

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
            yield from group_by_user(rows, dim)

    def stats(self) -> dict[str, Any]:
        out = {k: int(self._reader.execute(sql).fetchone()[0]) for k, sql in STATS_SQL.items()}
        size = self.path.stat().st_size if self.path.exists() else 0
        return {"path": str(self.path), **out, "bytes": size}


class Tx:
    """Writes (and the reads decisions need) inside one ledger transaction."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def lock_scope(self, user_id: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already serialises every write of the file."""

    # --- reads on the writer's snapshot ----------------------------------------------------
    def get(self, record_id: str) -> Record | None:
        row = self.cur.execute(
            f"SELECT {COLUMNS} FROM records WHERE id = ?", (record_id,)
        ).fetchone()
        return None if row is None else row_to_record(row)

    def by_fingerprints(self, user_id: str, fingerprints: Sequence[str]) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for i in range(0, len(fingerprints), 900):
            chunk = list(fingerprints[i : i + 900])
            for row in self.cur.execute(
                f"SELECT fingerprint, {COLUMNS} FROM records WHERE user_id = ? AND fingerprint "
                f"IN ({placeholders(len(chunk))}) AND superseded_by IS NULL ORDER BY rowid",
                [user_id, *chunk],
            ):
                out.setdefault(str(row[0]), row_to_record(row[1:]))
        return out

    def active(self, rowids: Sequence[int], user_id: str) -> dict[int, Record]:
        if not rowids:
            return {}
        rows = self.cur.execute(
            f"SELECT {COLUMNS} FROM records WHERE rowid IN ({placeholders(len(rowids))}) "
            "AND user_id = ? AND superseded_by IS NULL",
            [*rowids, user_id],
        ).fetchall()
        return {int(r[0]): row_to_record(r) for r in rows}

    # --- writes ----------------------------------------------------------------------------
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
        if len(records) != len(vectors):
            raise LedgerError("one vector per record is required")
        out: list[tuple[str, int]] = []
        cur = self.cur
        for rec, vec in zip(records, vectors, strict=True):
            rec.id = rec.id or new_id()
            cur.execute(
                "INSERT INTO records (id, user_id, agent_id, session_id, text, type, source,"
                " confidence, created_at, weight, evidence, fingerprint, scope_token, mentions)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                    rec.mentions,
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
        by_user: dict[str, list[str]] = {}
        for rec in records:
            by_user.setdefault(rec.scope.user_id, []).append(rec.text)
        for user_id, texts in by_user.items():
            self.count_terms(user_id, texts, +1)
        return out

    def supersede(self, old: Record, new_id_: str, detail: str = "") -> None:
        """Mark ``old`` as replaced by ``new_id_`` (it leaves the index, not the ledger) and
        record why in its history."""
        self.cur.execute("UPDATE records SET superseded_by = ? WHERE id = ?", (new_id_, old.id))
        self.cur.execute(
            "INSERT INTO changes(op, rowid, user_id) VALUES ('del', ?, ?)",
            (old.rowid, old.user_id),
        )
        self.count_terms(old.user_id, [old.text], -1)
        self.event(old.id, "contradicted", detail or f"superseded by {new_id_}")

    def delete(self, records: Iterable[Record]) -> int:
        """Delete records for good (ledger, FTS, vectors, events) and log it for the index."""
        n = 0
        for rec in records:
            self.cur.execute("DELETE FROM records WHERE rowid = ?", (rec.rowid,))
            self.cur.execute("DELETE FROM events WHERE record_id = ?", (rec.id,))
            if rec.superseded_by is None:
                self.cur.execute(
                    "INSERT INTO changes(op, rowid, user_id) VALUES ('del', ?, ?)",
                    (rec.rowid, rec.user_id),
                )
                self.count_terms(rec.user_id, [rec.text], -1)
            n += 1
        return n

    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None:
        self.cur.execute("UPDATE records SET mentions = mentions + 1 WHERE id = ?", (record_id,))
        if weight is not None:
            self.cur.execute(
                "UPDATE records SET weight = max(weight, ?) WHERE id = ?", (weight, record_id)
            )

    def confirm(self, rec: Record, evidence: Sequence[str], confidence: float, detail: str) -> None:
        """The verification path: later evidence (or the user) backs ``rec``."""
        merged = list(dict.fromkeys([*rec.evidence, *evidence]))
        self.cur.execute(
            "UPDATE records SET evidence = ?, confidence = max(confidence, ?) WHERE id = ?",
            (json.dumps(merged), confidence, rec.id),
        )
        self.event(rec.id, "confirmed", detail)

    def event(self, record_id: str, kind: EventKind, detail: str) -> None:
        self.cur.execute(
            "INSERT INTO events(record_id, ts, kind, detail) VALUES (?, ?, ?, ?)",
            (record_id, time.time(), kind, detail),
        )


class _Transaction:
    """``with ledger.write() as tx``: BEGIN IMMEDIATE under the write lock, COMMIT or ROLLBACK."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock

    def __enter__(self) -> Tx:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise LedgerError(f"cannot start a write: {exc}") from exc
        return Tx(self._conn.cursor())

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
