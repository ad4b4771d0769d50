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
import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memory.config import MemorySettings
from memory.embedding import Embedder, Vectors, make_embedder
from memory.exceptions import (
    IndexMismatchError,
    ModelError,
    NotFoundError,
    RedactedError,
    ScopeError,
)
from memory.index import ShardedIndex, shard_name
from memory.ledger import Ledger, NewRecord
from memory.llm import ModelClient
from memory.pipeline import (
    pack,
    prune_terms,
    query_terms,
    score_candidates,
    stem_terms,
    type_for_task,
)
from memory.records import (
    Candidate,
    MemorySource,
    MemoryType,
    Recall,
    Record,
    Scope,
    Turn,
    WriteResult,
)
from memory.replica import IndexReplica
from memory.writeback import apply_turn, fingerprint, only_redactions, redact, same_content

__all__ = ["AsyncMemoryStore", "RecallMode"]

logger = logging.getLogger(__name__)

RecallMode = Literal["hybrid", "vector", "keyword"]


class AsyncMemoryStore:
    """Long-term memory for many users in one ledger file. See docs/memory.md."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        settings: MemorySettings | None = None,
        model: ModelClient | None = None,
    ) -> None:
        self.settings = settings or MemorySettings()
        self.path = (Path(path) if path is not None else self.settings.resolved_path()).expanduser()
        self.embedder: Embedder = embedder or make_embedder(self.settings)
        s = self.settings
        if model is None and s.llm_base_url:
            model = ModelClient(
                s.llm_base_url, model=s.llm_model, api_key=s.llm_api_key, timeout_s=s.llm_timeout_s
            )
        self.model = model
        self._ledger: Ledger | None = None
        self._replica: IndexReplica | None = None
        self._open_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._usage: dict[int, tuple[int, float]] = {}
        self._usage_lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def index_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".index")

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("store is not open: await store.open() first")
        return self._ledger

    @property
    def replica(self) -> IndexReplica:
        if self._replica is None:
            raise RuntimeError("store is not open: await store.open() first")
        return self._replica

    @property
    def index(self) -> ShardedIndex:
        return self.replica.index

    async def open(self) -> AsyncMemoryStore:
        async with self._open_lock:
            if self._ledger is None:
                await asyncio.to_thread(self._open_sync)
        return self

    def _open_sync(self, *, check_embedder: bool = True) -> None:
        ledger = Ledger(self.path)
        name, dim = self.embedder.name, self.embedder.dim
        stored = ledger.get_meta("embedder")
        if stored is None:
            ledger.set_meta("embedder", f"{name}:{dim}")
        elif stored != f"{name}:{dim}" and check_embedder:
            ledger.close()
            raise IndexMismatchError(
                f"{self.path} was embedded with {stored}, this store uses {name}:{dim}; "
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
        if check_embedder:
            self.replica.open()
        else:
            index.wipe()  # about to re-embed everything and rebuild
        logger.info("memory store %s open: %d vectors", self.path, len(index))

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
    ) -> list[str]:
        """Store many memories of one scope in one transaction (all or nothing).

        Texts are redacted first; a text that is nothing but a secret raises
        :class:`RedactedError` and nothing is written. With ``check_conflicts`` an exact or
        near duplicate returns the existing id, and a close but different statement of the
        same type supersedes the older record. ``vectors`` skips embedding (benchmarks).
        """
        scope = Scope(user_id, agent_id, session_id)
        mtype, msource = MemoryType(type), MemorySource(source)
        clean: list[str] = []
        for text in texts:
            red, kinds = redact(text.strip())
            if not red or (kinds and only_redactions(red)):
                raise RedactedError("nothing left to store after removing secrets")
            clean.append(red)
        if created_at is not None and len(created_at) != len(clean):
            raise ValueError("created_at needs one timestamp per text")
        await self.open()
        vecs = vectors if vectors is not None else await self.embedder.embed(clean)
        now = time.time()
        base_weight = self.settings.default_weight if weight is None else weight
        items = [
            NewRecord(
                scope=scope,
                text=t,
                type=mtype,
                source=msource,
                confidence=confidence,
                weight=base_weight,
                evidence=list(evidence or []),
                fingerprint=fingerprint(t),
                created_at=created_at[i] if created_at is not None else now,
            )
            for i, t in enumerate(clean)
        ]
        async with self._write_lock:
            return await asyncio.to_thread(
                self._add_sync,
                items,
                np.asarray(vecs, dtype=np.float32),
                check_conflicts,
                supersedes,
            )

    def _add_sync(
        self, items: list[NewRecord], vecs: Vectors, check: bool, supersedes: str | None
    ) -> list[str]:
        self._flush_usage()
        self.replica.catch_up()
        s, ledger = self.settings, self.ledger
        result: list[str | None] = [None] * len(items)
        new_items: list[NewRecord] = []
        new_vecs: list[Vectors] = []
        replaced: list[tuple[Record, int]] = []  # (old record, index into new_items)
        batch_fp: dict[str, int] = {}
        for i, (item, vec) in enumerate(zip(items, vecs, strict=True)):
            if check:
                dup = ledger.by_fingerprint(item.scope.user_id, item.fingerprint)
                if dup is None and item.fingerprint in batch_fp:
                    result[i] = f"@{batch_fp[item.fingerprint]}"
                    continue
                old, sim = self._closest(item.scope, vec)
                if (
                    dup is None
                    and old is not None
                    and sim >= s.duplicate_similarity
                    and same_content(old.text, item.text)
                ):
                    dup = old
                if dup is not None:
                    ledger.bump_mentions(dup.id, weight=item.weight)
                    result[i] = dup.id
                    continue
                if old is not None and sim >= s.supersede_similarity and old.type == item.type:
                    replaced.append((old, len(new_items)))
            batch_fp[item.fingerprint] = len(new_items)
            result[i] = f"@{len(new_items)}"
            new_items.append(item)
            new_vecs.append(vec)
        if supersedes is not None and new_items:
            target = ledger.get(supersedes)
            if target is None or target.user_id != items[0].scope.user_id:
                raise NotFoundError(f"no record {supersedes} for this user")
            if target.superseded_by is None:
                replaced.append((target, 0))
        inserted = ledger.insert(new_items, np.stack(new_vecs)) if new_items else []
        for old, j in replaced:
            if old.superseded_by is None:
                ledger.supersede(old, inserted[j][0])
                logger.info("%s supersedes %s", inserted[j][0], old.id)
        self.replica.catch_up()
        self.replica.persist()
        out = [r if r and not r.startswith("@") else inserted[int(r[1:])][0] for r in result if r]
        return out

    def _closest(self, scope: Scope, vec: Vectors) -> tuple[Record | None, float]:
        hits = self.index.search(shard_name(scope.user_id), vec[None, :], 3)
        if not hits:
            return None, 0.0
        recs = self.ledger.by_rowids([h[0] for h in hits], Scope(scope.user_id))
        for rowid, sim in hits:
            if rowid in recs:
                return recs[rowid], sim
        return None, 0.0

    async def forget(self, record_id: str, *, user_id: str) -> list[str]:
        """Delete a record and the older versions it superseded, from ledger and index."""
        await self.open()
        async with self._write_lock:
            return await asyncio.to_thread(self._forget_sync, record_id, user_id)

    def _forget_sync(self, record_id: str, user_id: str) -> list[str]:
        rec = self.ledger.get(record_id)
        if rec is None or rec.user_id != user_id:
            raise NotFoundError(f"no record {record_id} for this user")
        doomed = [rec, *self.ledger.predecessors(rec.id)]
        self.ledger.delete(doomed)
        self.replica.catch_up()
        self.replica.persist()
        return [r.id for r in doomed]

    async def forget_matching(
        self, text: str, *, user_id: str, min_similarity: float = 0.55
    ) -> list[str]:
        """Forget every record of the user that matches ``text`` well (a forget request)."""
        rec = await self.recall(
            text, user_id=user_id, budget_tokens=10**9, threshold=-math.inf, max_items=10**6
        )
        doomed = [
            c.id
            for c in rec.candidates
            if c.similarity >= min_similarity or (c.keyword >= 0.99 and c.similarity >= 0.4)
        ]
        out: list[str] = []
        for rid in doomed:
            try:
                out += await self.forget(rid, user_id=user_id)
            except NotFoundError:
                continue  # already gone with an earlier chain
        return out

    async def decay(self, now: float | None = None) -> dict[str, int]:
        """Lower the weight of unused records (half-life) and prune the faded inferred ones."""
        await self.open()
        async with self._write_lock:
            return await asyncio.to_thread(self._decay_sync, time.time() if now is None else now)

    def _decay_sync(self, now: float) -> dict[str, int]:
        self._flush_usage()
        s, ledger = self.settings, self.ledger
        decayed, doomed = ledger.decay(now, s.decay_half_life_days, s.prune_below_weight)
        ledger.delete(doomed)
        self.replica.catch_up()
        self.replica.persist()
        return {"decayed": decayed, "pruned": len(doomed)}

    async def write_back(
        self,
        turn: Turn,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        distill: bool = True,
    ) -> list[WriteResult]:
        """Offer a finished turn to the promotion gate (see ``memory.writeback``)."""
        return await apply_turn(
            self, turn, user_id=user_id, agent_id=agent_id, session_id=session_id, distill=distill
        )

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
    ) -> Recall:
        """The four gates: query -> hybrid recall -> re-scoring -> packing."""
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
        # Gate 2's keyword side needs no embedding: it runs while the query is embedded.
        keyword = asyncio.create_task(asyncio.to_thread(self._keyword_sync, scope, q, mode))
        t1 = time.perf_counter()
        try:
            vec = (await self.embedder.embed([q]))[0]
        finally:
            timings["embed"] = (time.perf_counter() - t1) * 1e3
            kw_hits, timings["keyword"] = await keyword
        budget = self.settings.budget_tokens if budget_tokens is None else budget_tokens
        return await asyncio.to_thread(
            self._recall_sync,
            scope,
            q,
            vec,
            kw_hits,
            mode,
            budget,
            task,
            threshold,
            max_items,
            now,
            timings,
            t0,
        )

    def _keyword_sync(
        self, scope: Scope, q: str, mode: RecallMode
    ) -> tuple[dict[int, float], float]:
        """FTS5 side of gate 2: (rowid -> bm25, milliseconds)."""
        t = time.perf_counter()
        s, ledger = self.settings, self.ledger
        if mode == "vector" or s.keyword_k <= 0:
            return {}, 0.0
        self.replica.catch_up(blocking=False)
        terms = query_terms(q)
        n_docs = len(self.index)
        if terms and n_docs >= s.keyword_min_df_records:
            stems = stem_terms(terms)
            terms = prune_terms(
                terms,
                ledger.doc_freq(list(stems.values())),
                stems,
                n_docs,
                s.keyword_max_df,
                s.keyword_posting_budget,
            )
        hits = dict(ledger.keyword(scope, terms, s.keyword_k))
        return hits, (time.perf_counter() - t) * 1e3

    def _recall_sync(
        self,
        scope: Scope,
        q: str,
        vec: Vectors,
        kw_hits: dict[int, float],
        mode: RecallMode,
        budget: int,
        task: str | None,
        threshold: float | None,
        max_items: int | None,
        now: float | None,
        timings: dict[str, float],
        t0: float,
    ) -> Recall:
        s, ledger = self.settings, self.ledger
        self.replica.catch_up(blocking=False)
        t = time.perf_counter()
        vec_hits: dict[int, float] = {}
        if mode != "keyword":
            vec_hits = dict(self.index.search(shard_name(scope.user_id), vec[None, :], s.vector_k))
        timings["vector"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        records = ledger.by_rowids(list(vec_hits.keys() | kw_hits.keys()), scope)
        missing = [r for r in records if r not in vec_hits and mode != "keyword"]
        for rowid, v in ledger.vectors(missing, self.index.dim).items():
            vec_hits[rowid] = float(np.dot(v, vec))
        best_kw = max(kw_hits.values(), default=0.0)
        candidates = []
        for rowid, rec in records.items():
            c = Candidate(record=rec, similarity=vec_hits.get(rowid, 0.0))
            if rowid in kw_hits and best_kw > 0:
                c.keyword = kw_hits[rowid] / best_kw
                c.via.add("keyword")
            if rowid in vec_hits:
                c.via.add("vector")
            candidates.append(c)
        settings = s if mode != "keyword" else s.model_copy(update={"w_keyword": 1.0})
        scored = score_candidates(
            candidates, settings, task_type=type_for_task(task or q), now=now, threshold=threshold
        )
        items, block, tokens = pack(scored, budget, max_items=max_items or s.max_items)
        timings["score_pack"] = (time.perf_counter() - t) * 1e3
        ts = time.time()
        with self._usage_lock:
            for c in items:
                hits, _ = self._usage.get(c.record.rowid, (0, 0.0))
                self._usage[c.record.rowid] = (hits + 1, ts)
        timings["total"] = (time.perf_counter() - t0) * 1e3
        return Recall(q, items, block, scored, tokens, timings)

    async def get(self, record_id: str, *, user_id: str) -> Record:
        await self.open()
        rec = await asyncio.to_thread(self.ledger.get, record_id)
        if rec is None or rec.user_id != user_id:
            raise NotFoundError(f"no record {record_id} for this user")
        return rec

    async def history(self, record_id: str, *, user_id: str | None = None) -> list[Record]:
        """The supersede chain through ``record_id``, oldest first (audit trail)."""
        await self.open()
        return await asyncio.to_thread(self._history_sync, record_id, user_id)

    def _history_sync(self, record_id: str, user_id: str | None) -> list[Record]:
        rec = self.ledger.get(record_id)
        if rec is None or (user_id is not None and rec.user_id != user_id):
            raise NotFoundError(f"no record {record_id}")
        newest, seen = rec, {rec.id}
        while newest.superseded_by and newest.superseded_by not in seen:
            nxt = self.ledger.get(newest.superseded_by)
            if nxt is None:
                break
            seen.add(nxt.id)
            newest = nxt
        chain = [newest, *self.ledger.predecessors(newest.id)]
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
