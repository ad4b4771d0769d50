"""What the SQLite and the Postgres ledger share, written once.

* It builds on the plain rows and the dialects of ``loopstack.memory.ledger.rows`` (import them from
there).
* :class:`SqlLedger` and :class:`SqlTx`, the base classes of the two ledgers and of their
  write transactions: every read and write whose SQL is the same on both databases but for
  the spelling a :class:`Dialect` gives (``?`` or ``%s`` parameters, ``IN (...)`` or
  ``= ANY(...)``, ``max``/``greatest``, ``pow``/``power``). What truly differs (keyword
  recall, record inserts, keyword statistics, the change-log counter, connections and
  locking) stays in ``sqlite.py`` and ``postgres.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal

import numpy as np

from loopstack.memory.embedding import Vectors
from loopstack.memory.ledger.rows import (
    COLUMNS,
    FORGOTTEN,
    STATS_SQL,
    TOMBSTONE_TEXT,
    Change,
    Dialect,
    NewRecord,
    event_from_row,
    group_by_user,
    row_to_record,
)
from loopstack.memory.records import EventKind, MemoryType, Record, Scope, TrustEvent

__all__ = ["SqlLedger", "SqlTx", "redact_url"]


class SqlTx:
    """The writes of one transaction that read the same on both databases. A subclass says
    how a statement runs: now (``execute``, ``fetch``, ``many``) or whenever the transaction
    next talks to the database (``send``), and how a change-log entry is appended."""

    dialect: ClassVar[Dialect]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a write now; returns the rows it changed."""
        raise NotImplementedError

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run a statement now; returns its rows."""
        raise NotImplementedError

    def many(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    def send(self, sql: str, params: Sequence[Any]) -> None:
        """A write whose result nobody reads (it may travel with the next statement)."""
        raise NotImplementedError

    def log_change(self, op: Literal["add", "del"], rowid: int, user_id: str) -> None:
        raise NotImplementedError

    def lock_scope(self, user_id: str) -> None:
        raise NotImplementedError

    def count_terms(self, user_id: str, texts: Sequence[str], delta: int) -> None:
        raise NotImplementedError

    def event(self, record_id: str, kind: EventKind, detail: str) -> None:
        """A trust event of ``record_id`` (with its owner, as every user's row carries)."""
        p = self.dialect.p
        self.send(
            "INSERT INTO events(record_id, user_id, ts, kind, detail) "
            f"SELECT id, user_id, {p}, {p}, {p} FROM records WHERE id = {p}",
            (time.time(), kind, detail, record_id),
        )

    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]:
        raise NotImplementedError

    def by_fingerprints(self, user_id: str, fingerprints: Sequence[str]) -> dict[str, Record]:
        """The oldest active record of ``user_id`` with each of ``fingerprints`` (if any)."""
        raise NotImplementedError

    # --- reads on the transaction's snapshot -----------------------------------------------
    def get(self, record_id: str) -> Record | None:
        rows = self.fetch(
            f"SELECT {COLUMNS} FROM records WHERE id = {self.dialect.p}", (record_id,)
        )
        return row_to_record(rows[0]) if rows else None

    def active(self, rowids: Sequence[int], user_id: str) -> dict[int, Record]:
        if not rowids:
            return {}
        cond, params = self.dialect.any_of("rowid", rowids)
        rows = self.fetch(
            f"SELECT {COLUMNS} FROM records WHERE {cond} "
            f"AND user_id = {self.dialect.p} AND superseded_by IS NULL",
            [*params, user_id],
        )
        return {int(r[0]): row_to_record(r) for r in rows}

    # --- writes ----------------------------------------------------------------------------
    def supersede(self, old: Record, new_id_: str, detail: str = "") -> None:
        """Mark ``old`` as replaced by ``new_id_`` (it leaves the index, not the ledger) and
        record why in its history."""
        p = self.dialect.p
        self.send(f"UPDATE records SET superseded_by = {p} WHERE id = {p}", (new_id_, old.id))
        self.log_change("del", old.rowid, old.user_id)
        self.count_terms(old.user_id, [old.text], -1)
        self.event(old.id, "contradicted", detail or f"superseded by {new_id_}")

    def delete(self, records: Iterable[Record]) -> int:
        """Delete records for good (ledger, keyword index, vectors, events) and log it for
        the vector index."""
        p, n = self.dialect.p, 0
        for rec in records:
            self.send(f"DELETE FROM records WHERE rowid = {p}", (rec.rowid,))
            self.send(f"DELETE FROM events WHERE record_id = {p}", (rec.id,))
            if rec.superseded_by is None:
                self.log_change("del", rec.rowid, rec.user_id)
                self.count_terms(rec.user_id, [rec.text], -1)
            n += 1
        return n

    def tombstone(self, records: Iterable[Record], detail: str) -> int:
        """Forget records but keep their place in the audit trail: the text becomes
        :data:`TOMBSTONE_TEXT`, evidence, fingerprint and vector are erased, an active record
        leaves the index and the keyword side (``superseded_by`` = :data:`FORGOTTEN`), and
        every event keeps its kind and time but loses its detail (it may quote the text). A
        ``forgotten`` event says when. ``history`` still shows the supersede chain."""
        p, n = self.dialect.p, 0
        for rec in records:
            if rec.superseded_by is None:  # active: out of the vector index and term counts
                self.log_change("del", rec.rowid, rec.user_id)
                self.count_terms(rec.user_id, [rec.text], -1)
            self.send(
                f"UPDATE records SET superseded_by = coalesce(superseded_by, {p}), text = {p}, "
                f"evidence = '[]', fingerprint = '' WHERE rowid = {p}",
                (FORGOTTEN, TOMBSTONE_TEXT, rec.rowid),
            )
            self.send(f"DELETE FROM vectors WHERE rowid = {p}", (rec.rowid,))
            self.send(
                f"UPDATE events SET detail = {p} WHERE record_id = {p}", (TOMBSTONE_TEXT, rec.id)
            )
            self.event(rec.id, "forgotten", detail)
            n += 1
        return n

    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None:
        d = self.dialect
        self.send(
            f"UPDATE records SET mentions = mentions + 1, weight = {d.greatest}(weight, "
            f"coalesce({d.p}, weight)) WHERE id = {d.p}",
            (weight, record_id),
        )

    def confirm(self, rec: Record, evidence: Sequence[str], confidence: float, detail: str) -> None:
        """The verification path: later evidence (or the user) backs ``rec``."""
        d = self.dialect
        merged = list(dict.fromkeys([*rec.evidence, *evidence]))
        self.send(
            f"UPDATE records SET evidence = {d.p}, confidence = {d.greatest}(confidence, {d.p}) "
            f"WHERE id = {d.p}",
            (json.dumps(merged), confidence, rec.id),
        )
        self.event(rec.id, "confirmed", detail)


class SqlLedger:
    """The part of both ledgers whose SQL is the same: single writes (each its own
    ``write()`` transaction), maintenance writes and every read but keyword recall. A
    subclass gives ``write()``, ``_rows()`` (one read; ``scope`` is the user whose rows it
    may see, None for the maintenance scope) and its :class:`Dialect`."""

    dialect: ClassVar[Dialect]

    def write(self) -> AbstractContextManager[SqlTx]:
        raise NotImplementedError

    def _rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        scope: str | None = None,
        *,
        serial: bool = False,
    ) -> list[Any]:
        raise NotImplementedError

    # --- single writes ---------------------------------------------------------------------
    def insert(self, records: Sequence[NewRecord], vectors: Vectors) -> list[tuple[str, int]]:
        """Insert records with their vectors in one transaction; returns (id, rowid)."""
        with self.write() as tx:
            return tx.insert(records, vectors)

    def supersede(self, old: Record, new_id_: str, detail: str = "") -> None:
        with self.write() as tx:
            tx.supersede(old, new_id_, detail)

    def delete(self, records: Iterable[Record]) -> int:
        with self.write() as tx:
            return tx.delete(records)

    def bump_mentions(self, record_id: str, *, weight: float | None = None) -> None:
        with self.write() as tx:
            tx.bump_mentions(record_id, weight=weight)

    def set_meta(self, key: str, value: str) -> None:
        p = self.dialect.p
        with self.write() as tx:
            tx.execute(
                f"INSERT INTO meta(key, value) VALUES ({p}, {p}) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def touch(self, usage: dict[int, tuple[int, float]]) -> None:
        """Apply buffered recall usage: rowid -> (extra hits, last used ts)."""
        if not usage:
            return
        d = self.dialect
        with self.write() as tx:
            tx.many(
                f"UPDATE records SET hits = hits + {d.p}, last_used_at = "
                f"{d.greatest}(coalesce(last_used_at, 0), {d.p}) WHERE rowid = {d.p}",
                [(h, ts, rowid) for rowid, (h, ts) in sorted(usage.items())],  # one lock order
            )

    def observe(
        self, user_id: str, fingerprint: str, text: str, type_: MemoryType, vec: Vectors, ts: float
    ) -> int:
        """Count one more sighting of a not-yet-kept observation; returns the new count."""
        p = self.dialect.p
        with self.write() as tx:
            tx.lock_scope(user_id)
            rows = tx.fetch(
                f"INSERT INTO observations VALUES ({p},{p},{p},{p},1,{p},{p},{p}) "
                "ON CONFLICT (user_id, fingerprint) DO UPDATE SET "
                "count = observations.count + 1, last_seen = excluded.last_seen, "
                "text = excluded.text RETURNING count",
                (user_id, fingerprint, text, type_.value, ts, ts, vec.tobytes()),
            )
        return int(rows[0][0]) if rows else 0

    def drop_observation(self, user_id: str, fingerprint: str) -> None:
        p = self.dialect.p
        with self.write() as tx:
            tx.lock_scope(user_id)
            tx.execute(
                f"DELETE FROM observations WHERE user_id = {p} AND fingerprint = {p}",
                (user_id, fingerprint),
            )

    def decay(
        self, now: float, half_life_days: float, prune_below: float, explicit_floor: float = 0.0
    ) -> tuple[int, list[Record]]:
        """Halve weights per ``half_life_days`` of disuse since the later of last use and the
        previous run (read and written in the same transaction, serialised with other runs:
        two servers never apply the same interval twice); a ``user_explicit`` weight stops at
        ``explicit_floor``. Returns (records whose weight changed - a change under 0.01 % is
        neither applied nor counted -, faded non-explicit records to prune)."""
        d, p = self.dialect, self.dialect.p
        factor = (
            f"{d.power}(0.5, {d.greatest}(0.0, {p} - {d.greatest}(created_at, "
            f"coalesce(last_used_at, 0), {p})) / 86400.0 / {p})"
        )
        new = (
            f"CASE WHEN source = 'user_explicit' THEN {d.greatest}({d.least}(weight, {p}), "
            f"weight * {factor}) ELSE weight * {factor} END"
        )
        with self.write() as tx:
            # the last run's time, locked until this run commits (Postgres: the row lock
            # serialises servers; SQLite: BEGIN IMMEDIATE already does)
            tx.execute(
                f"INSERT INTO meta(key, value) VALUES ({p}, '0') ON CONFLICT (key) DO NOTHING",
                ("decayed_at",),
            )
            rows = tx.fetch(
                f"SELECT value FROM meta WHERE key = {p}{d.for_update}", ("decayed_at",)
            )
            prev = float(rows[0][0]) if rows else 0.0
            args = (explicit_floor, now, prev, half_life_days, now, prev, half_life_days)
            decayed = tx.execute(
                f"UPDATE records SET weight = {new} WHERE superseded_by IS NULL "
                f"AND {new} < weight * (1.0 - 1e-4)",
                (*args, *args),
            )
            tx.execute(
                f"INSERT INTO meta(key, value) VALUES ({p}, {p}) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                ("decayed_at", repr(now)),
            )
            rows = tx.fetch(
                f"SELECT {COLUMNS} FROM records WHERE weight < {p} "
                "AND source != 'user_explicit' AND superseded_by IS NULL",
                (prune_below,),
            )
        return decayed, [row_to_record(r) for r in rows]

    def set_vectors(self, pairs: Sequence[tuple[int, Vectors]]) -> None:
        """Replace stored vectors (re-embedding): (rowid, vector) pairs."""
        p = self.dialect.p
        with self.write() as tx:
            tx.many(
                f"UPDATE vectors SET vec = {p} WHERE rowid = {p}",
                [(np.asarray(v, dtype=np.float32).tobytes(), r) for r, v in pairs],
            )

    # --- reads -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._rows(f"SELECT value FROM meta WHERE key = {self.dialect.p}", (key,))
        return None if not rows else str(rows[0][0])

    def get(self, record_id: str) -> Record | None:
        rows = self._rows(
            f"SELECT {COLUMNS} FROM records WHERE id = {self.dialect.p}", (record_id,)
        )
        return row_to_record(rows[0]) if rows else None

    def by_rowids(self, rowids: Sequence[int], scope: Scope) -> dict[int, Record]:
        """Active records among ``rowids`` that belong to ``scope`` (the isolation check)."""
        if not rowids:
            return {}
        p = self.dialect.p
        cond, params = self.dialect.any_of("rowid", rowids)
        sql = f"SELECT {COLUMNS} FROM records WHERE {cond} AND user_id = {p} "
        sql += "AND superseded_by IS NULL"
        params.append(scope.user_id)
        if scope.agent_id is not None:
            sql += f" AND (agent_id IS NULL OR agent_id = {p})"
            params.append(scope.agent_id)
        if scope.session_id is not None:
            sql += f" AND (session_id IS NULL OR session_id = {p})"
            params.append(scope.session_id)
        rows = self._rows(sql, params, scope.user_id)
        return {int(r[0]): row_to_record(r) for r in rows}

    def vectors(self, rowids: Sequence[int], dim: int) -> dict[int, Vectors]:
        if not rowids:
            return {}
        cond, params = self.dialect.any_of("rowid", rowids)
        rows = self._rows(f"SELECT rowid, vec FROM vectors WHERE {cond}", params)
        return {int(r[0]): np.frombuffer(r[1], dtype=np.float32, count=dim) for r in rows}

    def by_fingerprint(self, user_id: str, fingerprint: str) -> Record | None:
        p = self.dialect.p
        rows = self._rows(
            f"SELECT {COLUMNS} FROM records WHERE user_id = {p} AND fingerprint = {p} "
            "AND superseded_by IS NULL ORDER BY rowid LIMIT 1",
            (user_id, fingerprint),
            user_id,
        )
        return row_to_record(rows[0]) if rows else None

    def list_records(
        self, user_id: str, *, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]:
        p = self.dialect.p
        sql = f"SELECT {COLUMNS} FROM records WHERE user_id = {p}"
        if not include_superseded:
            sql += " AND superseded_by IS NULL"
        sql += f" ORDER BY created_at DESC, rowid DESC LIMIT {p} OFFSET {p}"
        return [row_to_record(r) for r in self._rows(sql, (user_id, limit, offset), user_id)]

    def predecessors(self, record_id: str) -> list[Record]:
        """Records this one superseded, newest first (the audit chain)."""
        out: list[Record] = []
        seen = {record_id}
        frontier = [record_id]
        while frontier:
            cond, params = self.dialect.any_of("superseded_by", frontier)
            rows = self._rows(
                f"SELECT {COLUMNS} FROM records WHERE {cond} ORDER BY created_at DESC", params
            )
            frontier = []
            for r in rows:
                rec = row_to_record(r)
                if rec.id not in seen:
                    seen.add(rec.id)
                    out.append(rec)
                    frontier.append(rec.id)
        return out

    def doc_freq(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        """This user's active records containing each (stemmed, lower-case) term. Per user, so
        one tenant's data never changes which terms another tenant's queries keep."""
        if not terms:
            return {}
        cond, params = self.dialect.any_of("term", terms)
        rows = self._rows(
            f"SELECT term, df FROM user_terms WHERE user_id = {self.dialect.p} AND {cond}",
            [user_id, *params],
            user_id,
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def events(self, record_ids: Sequence[str]) -> dict[str, list[TrustEvent]]:
        """Trust events (confirmed / contradicted) of each record, oldest first."""
        if not record_ids:
            return {}
        cond, params = self.dialect.any_of("record_id", record_ids)
        rows = self._rows(
            f"SELECT record_id, ts, kind, detail FROM events WHERE {cond} "
            "ORDER BY ts, seq",  # oldest first, ties in insertion order
            params,
        )
        out: dict[str, list[TrustEvent]] = {}
        for r in rows:
            out.setdefault(str(r[0]), []).append(event_from_row(r[1:]))
        return out

    def active_rowids(self, rowids: Sequence[int]) -> list[int]:
        """Those of ``rowids`` whose records are still active (not superseded or deleted)."""
        out: list[int] = []
        step = self.dialect.max_in
        for i in range(0, len(rowids), step):
            cond, params = self.dialect.any_of("rowid", rowids[i : i + step])
            rows = self._rows(
                f"SELECT rowid FROM records WHERE superseded_by IS NULL AND {cond}", params
            )
            out.extend(int(r[0]) for r in rows)
        return out

    def texts_after(self, rowid: int, limit: int = 512) -> list[tuple[int, str]]:
        """(rowid, text) of records after ``rowid`` in rowid order (re-embedding batches)."""
        p = self.dialect.p
        rows = self._rows(
            f"SELECT rowid, text FROM records WHERE rowid > {p} ORDER BY rowid LIMIT {p}",
            (rowid, limit),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def count(self, user_id: str | None = None, *, active_only: bool = True) -> int:
        sql = "SELECT count(*) FROM records WHERE 1=1"
        params: list[Any] = []
        if user_id is not None:
            sql += f" AND user_id = {self.dialect.p}"
            params.append(user_id)
        if active_only:
            sql += " AND superseded_by IS NULL"
        return int(self._rows(sql, params, user_id)[0][0])

    def observations(self, user_id: str) -> list[tuple[str, str, int, Vectors]]:
        rows = self._rows(
            "SELECT fingerprint, text, count, vec FROM observations "
            f"WHERE user_id = {self.dialect.p}",
            (user_id,),
            user_id,
        )
        return [(r[0], r[1], int(r[2]), np.frombuffer(r[3], dtype=np.float32)) for r in rows]

    def changes_since(self, seq: int) -> list[Change]:
        rows = self._rows(
            f"SELECT seq, op, rowid, user_id FROM changes WHERE seq > {self.dialect.p} "
            "ORDER BY seq",
            (seq,),
        )
        return [Change(int(r[0]), r[1], int(r[2]), str(r[3])) for r in rows]

    def active_vectors(self, dim: int, batch: int = 50_000) -> Iterator[tuple[str, Any, Vectors]]:
        """(user_id, rowids, vectors) batches of every active record, for a rebuild."""
        p, last = self.dialect.p, 0
        while True:
            rows = self._rows(
                "SELECT r.rowid, r.user_id, v.vec FROM records r JOIN vectors v "
                f"ON v.rowid = r.rowid WHERE r.rowid > {p} AND r.superseded_by IS NULL "
                f"ORDER BY r.rowid LIMIT {p}",
                (last, batch),
            )
            if not rows:
                return
            last = int(rows[-1][0])
            yield from group_by_user(rows, dim)

    def _table_counts(self) -> dict[str, int]:
        """The :data:`STATS_SQL` figures."""
        return {k: int(self._rows(sql)[0][0]) for k, sql in STATS_SQL.items()}


def redact_url(url: str) -> str:
    """The URL without its password (for logs and stats)."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
