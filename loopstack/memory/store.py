"""``AsyncMemoryStore``: the ledger, the vector index and the load pipeline put together.

Every blocking step (SQLite, FAISS, the embedding model) runs in a worker thread, so the
event loop never stalls. Writes are serialised by one asyncio lock (and SQLite's own write
lock across processes); recalls take no write lock at all: SQLite WAL serves them the last
committed state, and a FAISS shard is locked only for the milliseconds an insert takes.

After every write the index replays the ledger's change log (``_catch_up``), so the index
can never be ahead of the ledger, and after a crash it simply replays the rest.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from loopstack.memory.config import MemorySettings, loopstack_home
from loopstack.memory.embedding import (
    Embedder,
    QueryCache,
    Vectors,
    embedder_named,
    make_embedder,
)
from loopstack.memory.exceptions import (
    IndexMismatchError,
    ModelError,
    NotFoundError,
    RejectedError,
    ScopeError,
)
from loopstack.memory.execution import execute
from loopstack.memory.forgetting import decay_now, decay_schedule, forget_chain, matching_ids
from loopstack.memory.index import ShardedIndex
from loopstack.memory.ledger.backend import LedgerBackend, is_url, open_ledger, url_key
from loopstack.memory.ledger.rows import NewRecord
from loopstack.memory.llm import ModelClient
from loopstack.memory.reader import RecallMode, RecallReader
from loopstack.memory.records import (
    Candidate,
    DistilledMemory,
    MemorySource,
    MemoryType,
    Recall,
    Record,
    Scope,
    Turn,
    WriteResult,
)
from loopstack.memory.replica import IndexReplica
from loopstack.memory.trust import USER_CONFIRMED
from loopstack.memory.writeback import plan_turn, redact, redact_turn
from loopstack.memory.writer import OnConflict, RecordWriter, new_records, storable_texts

__all__ = ["AsyncMemoryStore", "OnConflict", "RecallMode"]

logger = logging.getLogger(__name__)

#: The store whose ``write_back`` runs in this task (it already holds its write lock).
_WRITE_BACK_OWNER: contextvars.ContextVar[AsyncMemoryStore | None] = contextvars.ContextVar(
    "memory_write_back_owner", default=None
)

_Part = TypeVar("_Part")


def _opened(part: _Part | None) -> _Part:
    """A part the store makes on ``open()`` (ledger, replica, writer, reader), or the one
    error every use of a store that is not open gets."""
    if part is None:
        raise RuntimeError("store is not open: await store.open() first")
    return part


class AsyncMemoryStore:
    """Long-term memory for many users in one ledger: a SQLite file, or one Postgres database
    that many app servers share. See docs/memory.md."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        settings: MemorySettings | None = None,
        model: ModelClient | None = None,
    ) -> None:
        self.settings = settings or MemorySettings()
        where = path if path is not None else self.settings.location()
        #: ``postgresql://...`` for a shared Postgres ledger, else None (a SQLite file).
        self.url: str | None = str(where) if is_url(where) else None
        #: The SQLite ledger file, or for Postgres the local base name of this server's replica.
        self.path = (
            Path(self.settings.index_dir or loopstack_home() / "memory" / url_key(self.url))
            if self.url
            else Path(where).expanduser()
        )
        self.embedder: Embedder = embedder or make_embedder(self.settings)
        #: Vectors of recent queries (``QueryCache``): a repeated question skips the embedder.
        self._queries = QueryCache(self.settings.query_cache_size)
        #: ``embedder=auto`` chose the model: an existing store's own model wins on open.
        self._auto_embedder = embedder is None and self.settings.embedder == "auto"
        s = self.settings
        if model is None and s.llm_base_url:
            model = ModelClient(
                s.llm_base_url, model=s.llm_model, api_key=s.llm_api_key, timeout_s=s.llm_timeout_s
            )
        self.model = model
        self._ledger: LedgerBackend | None = None
        self._replica: IndexReplica | None = None
        self._writer: RecordWriter | None = None
        self._reader: RecallReader | None = None
        self._open_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._usage: dict[int, tuple[int, float]] = {}
        self._usage_lock = threading.Lock()
        self._next_decay = math.inf  # when the decay schedule is next checked (on open)

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def index_dir(self) -> Path:
        if self.settings.index_dir is not None:
            return self.settings.index_dir.expanduser()
        return self.path.with_name(self.path.name + ".index")

    @property
    def ledger(self) -> LedgerBackend:
        return _opened(self._ledger)

    @property
    def replica(self) -> IndexReplica:
        return _opened(self._replica)

    @property
    def writer(self) -> RecordWriter:
        return _opened(self._writer)

    @property
    def reader(self) -> RecallReader:
        return _opened(self._reader)

    @property
    def index(self) -> ShardedIndex:
        return self.replica.index

    async def open(self) -> AsyncMemoryStore:
        async with self._open_lock:
            if self._ledger is None:
                await asyncio.to_thread(self._open_sync)
        return self

    def _open_sync(self, *, check_embedder: bool = True) -> None:
        ledger = open_ledger(self.url or self.path, allow_no_rls=self.settings.allow_no_rls)
        stored = ledger.get_meta("embedder")
        if self._auto_embedder and check_embedder and stored is not None:
            own = embedder_named(stored, self.settings)
            if (
                own is not None
                and f"{own.name}:{own.dim}" != f"{self.embedder.name}:{self.embedder.dim}"
            ):
                logger.info("memory: this store was built with %s; keeping it", stored)
                self.embedder = own
        name, dim = self.embedder.name, self.embedder.dim
        if stored is None:
            ledger.set_meta("embedder", f"{name}:{dim}")
        elif stored != f"{name}:{dim}" and check_embedder:
            ledger.close()
            raise IndexMismatchError(
                f"{ledger.describe()} was embedded with {stored}, this store uses {name}:{dim}; "
                "run `loopstack memory reindex --reembed`"
            )
        s = self.settings
        index = ShardedIndex(
            self.index_dir,
            dim=dim,
            model=name,
            kind=s.index_kind,
            hnsw_threshold=s.hnsw_threshold,
            hnsw_m=s.hnsw_m,
            hnsw_ef_construction=s.hnsw_ef_construction,
            hnsw_ef_search=s.hnsw_ef_search,
        )
        self._ledger, self._replica = ledger, IndexReplica(ledger, index, s)
        self._writer = RecordWriter(ledger, self._replica, s)
        self._reader = RecallReader(ledger, self._replica, s, self._record_usage)
        replica = self._replica
        ledger.on_change(lambda: replica.catch_up(blocking=False))  # other servers' writes
        if check_embedder:
            self.replica.open()
        else:
            index.wipe()  # about to re-embed everything and rebuild
        logger.info("memory store %s open: %d vectors", ledger.describe(), len(index))
        if check_embedder:
            self._decay_if_due(time.time())

    def _decay_if_due(self, now: float) -> None:
        """On open and after a write-back: decay when due (``loopstack.memory.forgetting``)."""
        self._next_decay = decay_schedule(self.ledger, self.settings, now, self._decay_sync)

    async def close(self) -> None:
        async with self._write_lock:
            if self._ledger is not None:
                await asyncio.to_thread(self._close_sync)
        if self.model is not None:
            await self.model.close()

    def _close_sync(self) -> None:
        self._flush_usage()
        self.replica.persist(force=True)
        self.ledger.close()
        self._ledger = self._replica = None
        self._writer = self._reader = None

    async def __aenter__(self) -> AsyncMemoryStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _flush_usage(self) -> None:
        with self._usage_lock:
            usage, self._usage = self._usage, {}
        self.ledger.touch(usage)

    # --- writes --------------------------------------------------------------------------
    async def add(
        self,
        text: str,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        type: MemoryType | str = MemoryType.FACT,
        source: MemorySource | str = MemorySource.USER_EXPLICIT,
        confidence: float = 1.0,
        evidence: Sequence[str] | None = None,
        weight: float | None = None,
        created_at: float | None = None,
        supersedes: str | None = None,
        check_conflicts: bool = True,
        on_conflict: OnConflict = "supersede",
    ) -> str:
        """Store one memory; returns its id (an existing id when it is a duplicate)."""
        ids = await self.add_many(
            [text],
            user_id=user_id,
            agent_id=agent_id,
            session_id=session_id,
            type=type,
            source=source,
            confidence=confidence,
            evidence=evidence,
            weight=weight,
            created_at=None if created_at is None else [created_at],
            check_conflicts=check_conflicts,
            supersedes=supersedes,
            on_conflict=on_conflict,
        )
        return ids[0]

    async def add_many(
        self,
        texts: Sequence[str],
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        type: MemoryType | str = MemoryType.FACT,
        source: MemorySource | str = MemorySource.USER_EXPLICIT,
        confidence: float = 1.0,
        evidence: Sequence[str] | None = None,
        weight: float | None = None,
        created_at: Sequence[float] | None = None,
        check_conflicts: bool = True,
        supersedes: str | None = None,
        vectors: Vectors | None = None,
        on_conflict: OnConflict = "supersede",
        mentions: int = 1,
    ) -> list[str]:
        """Store many memories of one scope in one transaction (all or nothing).

        Texts and evidence ids are redacted first; a text that is nothing but a secret
        raises :class:`RedactedError` and nothing is written. With ``check_conflicts`` an
        exact or near duplicate returns the existing id (and may confirm it), and a record
        stating the same subject with a new value supersedes the older one unless
        ``on_conflict="keep"`` (see ``loopstack.memory.writer``). ``vectors`` skips embedding.
        """
        scope = Scope(user_id, agent_id, session_id)
        mtype, msource = MemoryType(type), MemorySource(source)
        clean = storable_texts(texts)
        if created_at is not None and len(created_at) != len(clean):
            raise ValueError("created_at needs one timestamp per text")
        await self.open()
        vecs = vectors if vectors is not None else await self.embedder.embed(clean)
        base_weight = self.settings.default_weight if weight is None else weight
        items = new_records(
            clean, scope, mtype, msource, confidence, base_weight, evidence, created_at, mentions
        )
        vec_arr = np.asarray(vecs, dtype=np.float32)
        if self._write_lock.locked() and _WRITE_BACK_OWNER.get() is self:
            return await self._write(items, vec_arr, check_conflicts, supersedes, on_conflict)
        async with self._write_lock:
            return await self._write(items, vec_arr, check_conflicts, supersedes, on_conflict)

    async def _write(
        self,
        items: list[NewRecord],
        vecs: Vectors,
        check: bool,
        supersedes: str | None,
        on_conflict: OnConflict,
    ) -> list[str]:
        """Run the writer in a thread; the caller holds ``_write_lock``."""

        def run() -> list[str]:
            self._flush_usage()
            return self.writer.add(
                items, vecs, check=check, supersedes=supersedes, on_conflict=on_conflict
            )

        return await asyncio.to_thread(run)

    async def verify(
        self,
        record_id: str,
        *,
        user_id: str,
        evidence: Sequence[str] | None = None,
        by_user: bool = False,
    ) -> Record:
        """The verification path by hand: ``evidence`` (tool result ids) or the user
        (``by_user``) confirm a record; it gains trust and a ``confirmed`` history event."""
        if not evidence and not by_user:
            raise ValueError("verify needs evidence or by_user=True")
        await self.open()
        proofs = [redact(e)[0] for e in evidence or []] + ([USER_CONFIRMED] if by_user else [])

        def run() -> None:
            with self.ledger.write() as tx:
                tx.lock_scope(user_id)
                rec = tx.get(record_id)
                if rec is None or rec.user_id != user_id:
                    raise NotFoundError(f"no record {record_id} for this user")
                what = "the user" if by_user else "evidence " + ", ".join(proofs[:4])
                tx.confirm(rec, proofs, 1.0 if by_user else rec.confidence, f"confirmed by {what}")

        async with self._write_lock:
            await asyncio.to_thread(run)
        return await self.get(record_id, user_id=user_id)

    async def forget(self, record_id: str, *, user_id: str) -> list[str]:
        """Forget a record and the older versions it superseded: their text, evidence and
        vectors are erased and they leave the index and keyword recall, but each stays in
        the ledger as a tombstone (``[forgotten]``, with a ``forgotten`` event), so
        ``history`` still shows the supersede chain."""
        await self.open()
        async with self._write_lock:
            return await asyncio.to_thread(self._forget_sync, record_id, user_id)

    def _forget_sync(self, record_id: str, user_id: str) -> list[str]:
        return forget_chain(self.ledger, self.replica, record_id, user_id)

    async def forget_matching(
        self, text: str, *, user_id: str, min_similarity: float = 0.55
    ) -> list[str]:
        """Forget every record of the user that matches ``text`` well (a forget request):
        its hybrid relevance, the same ``similarity + w_keyword * keyword`` recall ranks by
        (``Candidate.relevance``), is at least ``min_similarity``. "sister" thus forgets "My
        sister lives in Porto" (MiniLM cosine 0.40 plus 0.3 for a full keyword match)."""
        async with self._write_lock:
            return await self._forget_matching(text, user_id, min_similarity)

    async def _forget_matching(self, text: str, user_id: str, min_similarity: float) -> list[str]:
        rec = await self.recall(
            text,
            user_id=user_id,
            budget_tokens=10**9,
            threshold=-math.inf,
            max_items=10**6,
            include_unverified=True,
        )
        out: list[str] = []
        for rid in matching_ids(rec.candidates, text, min_similarity):
            try:
                out += await asyncio.to_thread(self._forget_sync, rid, user_id)
            except NotFoundError:
                continue  # already gone with an earlier chain
        return out

    async def decay(self, now: float | None = None) -> dict[str, int]:
        """Lower the weight of unused records (half-life; a ``user_explicit`` one never below
        ``explicit_weight_floor``) and prune the faded non-explicit ones. ``decayed`` counts
        the records whose weight changed. Runs by itself when a store opens and it is due
        (``decay_every_hours``); this runs it now (``now``: the time to decay to)."""
        await self.open()
        async with self._write_lock:
            return await asyncio.to_thread(self._decay_sync, time.time() if now is None else now)

    def _decay_sync(self, now: float) -> dict[str, int]:
        self._flush_usage()
        return decay_now(self.ledger, self.replica, self.settings, now)

    async def write_back(
        self,
        turn: Turn,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        distill: bool = True,
    ) -> list[WriteResult]:
        """Offer a finished turn to the promotion gate: ``loopstack.memory.writeback`` plans, the
        store carries the plan out under its write lock (one proposal after the other)."""
        scope = Scope(user_id, agent_id, session_id)
        turn = redact_turn(turn)  # secrets never reach the model, the embedder or the ledger
        distilled: list[DistilledMemory] = []
        if distill and self.model is not None:
            try:
                distilled = await self.model.distill(turn)
            except ModelError as exc:
                logger.warning("distillation failed, using rules only: %s", exc)
        s = self.settings
        proposals = plan_turn(
            turn,
            distilled=distilled,
            explicit_weight=s.explicit_weight,
            unsupported_weight=s.unsupported_weight,
        )
        await self.open()
        results: list[WriteResult] = []
        async with self._write_lock:
            token = _WRITE_BACK_OWNER.set(self)
            try:
                for p in proposals:
                    try:
                        results.append(await execute(self, p, scope))
                    except RejectedError as exc:
                        results.append(WriteResult("rejected", reason=str(exc), text=p.text))
                if time.time() >= self._next_decay:  # a long-running server: due again
                    await asyncio.to_thread(self._decay_if_due, time.time())
            finally:
                _WRITE_BACK_OWNER.reset(token)
        return results

    # --- reads ---------------------------------------------------------------------------
    async def recall(
        self,
        query: str,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        budget_tokens: int | None = None,
        task: str | None = None,
        mode: RecallMode = "hybrid",
        threshold: float | None = None,
        max_items: int | None = None,
        now: float | None = None,
        include_unverified: bool = False,
    ) -> Recall:
        """The four gates: query -> hybrid recall -> re-scoring -> packing. Records below
        the trust floor (unverified ones) are left out unless ``include_unverified``."""
        scope = Scope(user_id, agent_id, session_id)
        await self.open()
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        q = query
        if self.model is not None and self.settings.rewrite_queries:
            try:
                q = await self.model.rewrite_query(query, task)
            except ModelError as exc:
                logger.warning("query rewrite failed, using the message as is: %s", exc)
        timings["rewrite"] = (time.perf_counter() - t0) * 1e3
        reader = self.reader
        # Gate 2's keyword side needs no embedding: it runs while the query is embedded.
        keyword = asyncio.create_task(asyncio.to_thread(reader.keyword, scope, q, mode))
        t1 = time.perf_counter()
        try:
            vec = await self._queries.vector(self.embedder, q)
        finally:
            timings["embed"] = (time.perf_counter() - t1) * 1e3
            kw_hits, timings["keyword"] = await keyword
        budget = self.settings.budget_tokens if budget_tokens is None else budget_tokens
        return await asyncio.to_thread(
            functools.partial(
                reader.recall,
                scope,
                q,
                vec,
                kw_hits,
                mode=mode,
                budget=budget,
                task=task,
                threshold=threshold,
                max_items=max_items,
                now=now,
                include_unverified=include_unverified,
                timings=timings,
                t0=t0,
            )
        )

    def _record_usage(self, items: list[Candidate]) -> None:
        ts = time.time()
        with self._usage_lock:
            for c in items:
                hits, _ = self._usage.get(c.record.rowid, (0, 0.0))
                self._usage[c.record.rowid] = (hits + 1, ts)

    async def get(self, record_id: str, *, user_id: str) -> Record:
        """One record of this user, with its trust events."""
        await self.open()
        rec = await asyncio.to_thread(self.ledger.get, record_id)
        if rec is None or rec.user_id != user_id:
            raise NotFoundError(f"no record {record_id} for this user")
        rec.events = (await asyncio.to_thread(self.ledger.events, [rec.id])).get(rec.id, [])
        return rec

    async def history(self, record_id: str, *, user_id: str) -> list[Record]:
        """The supersede chain through ``record_id``, oldest first, each version with its
        trust events (confirmed / contradicted): the audit trail. Scoped to ``user_id``."""
        if not user_id:
            raise ScopeError("user_id is required")
        await self.open()
        return await asyncio.to_thread(self._history_sync, record_id, user_id)

    def _history_sync(self, record_id: str, user_id: str) -> list[Record]:
        rec = self.ledger.get(record_id)
        if rec is None or rec.user_id != user_id:
            raise NotFoundError(f"no record {record_id} for this user")
        newest, seen = rec, {rec.id}
        while newest.superseded_by and newest.superseded_by not in seen:
            nxt = self.ledger.get(newest.superseded_by)
            if nxt is None or nxt.user_id != user_id:
                break
            seen.add(nxt.id)
            newest = nxt
        chain = [r for r in [newest, *self.ledger.predecessors(newest.id)] if r.user_id == user_id]
        events = self.ledger.events([r.id for r in chain])
        for r in chain:
            r.events = events.get(r.id, [])
        return sorted(chain, key=lambda r: (r.created_at, r.rowid))

    async def stats(self) -> dict[str, Any]:
        await self.open()
        out = await asyncio.to_thread(self.ledger.stats)
        idx = self.index
        out.update(
            index_dir=str(self.index_dir),
            index_vectors=len(idx),
            shards=len(idx.shards),
            hnsw_shards=sum(1 for sh in idx.shards.values() if sh.kind == "hnsw"),
            applied_seq=self.replica.applied,
            embedder=f"{self.embedder.name}:{self.embedder.dim}",
        )
        return out

    async def reindex(self, *, reembed: bool = False) -> dict[str, Any]:
        """Rebuild the FAISS index from the ledger (re-embedding every text if asked)."""
        if reembed and self._ledger is None:
            async with self._open_lock:
                await asyncio.to_thread(self._open_sync, check_embedder=False)
        await self.open()
        async with self._write_lock:
            if reembed:
                await self.replica.reembed(self.embedder)
            return await asyncio.to_thread(self.replica.rebuild)

    async def list(
        self, *, user_id: str, include_superseded: bool = False, limit: int = 50, offset: int = 0
    ) -> list[Record]:
        if not user_id:
            raise ScopeError("user_id is required")
        await self.open()
        return await asyncio.to_thread(
            self.ledger.list_records,
            user_id,
            include_superseded=include_superseded,
            limit=limit,
            offset=offset,
        )
