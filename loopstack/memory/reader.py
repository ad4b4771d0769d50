"""``RecallReader``: gates 2-4 of the load pipeline over the ledger and the index (sync,
worker-thread code; ``AsyncMemoryStore.recall`` runs gate 1 and calls it).

Recall takes no write lock: the ledger's reader connections see the last committed state
(WAL), the index catches up without blocking, and usage (hits, last use) is buffered by the
store and written by its next write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import numpy as np

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Vectors
from loopstack.memory.index import shard_name
from loopstack.memory.ledger.backend import LedgerBackend
from loopstack.memory.pipeline import (
    pack,
    prune_terms,
    query_terms,
    score_candidates,
    stem_terms,
    type_for_task,
)
from loopstack.memory.records import Candidate, Recall, Scope
from loopstack.memory.replica import IndexReplica

__all__ = ["RecallMode", "RecallReader"]

RecallMode = Literal["hybrid", "vector", "keyword"]


class RecallReader:
    """Hybrid recall, re-scoring and packing for one store."""

    def __init__(
        self,
        ledger: LedgerBackend,
        replica: IndexReplica,
        settings: MemorySettings,
        record_usage: Callable[[list[Candidate]], None],
    ) -> None:
        self.ledger, self.replica, self.settings = ledger, replica, settings
        self._record_usage = record_usage

    def keyword(self, scope: Scope, q: str, mode: RecallMode) -> tuple[dict[int, float], float]:
        """FTS5 side of gate 2: (rowid -> bm25, milliseconds). Term statistics are the
        user's own (``user_terms``), never other users'."""
        t = time.perf_counter()
        s, ledger = self.settings, self.ledger
        if mode == "vector" or s.keyword_k <= 0:
            return {}, 0.0
        self.replica.catch_up(blocking=False)
        terms = query_terms(q)
        shard = self.replica.index.shards.get(shard_name(scope.user_id))
        n_docs = len(shard) if shard is not None else 0
        if terms and n_docs >= s.keyword_min_df_records:
            stems = stem_terms(terms)
            terms = prune_terms(
                terms,
                ledger.doc_freq(scope.user_id, list(stems.values())),
                stems,
                n_docs,
                s.keyword_max_df,
                s.keyword_posting_budget,
            )
        hits = dict(ledger.keyword(scope, terms, s.keyword_k))
        return hits, (time.perf_counter() - t) * 1e3

    def recall(
        self,
        scope: Scope,
        q: str,
        vec: Vectors,
        kw_hits: dict[int, float],
        *,
        mode: RecallMode,
        budget: int,
        task: str | None,
        threshold: float | None,
        max_items: int | None,
        now: float | None,
        include_unverified: bool,
        timings: dict[str, float],
        t0: float,
    ) -> Recall:
        """Gates 2 (vector side and merge), 3 and 4."""
        s, ledger, index = self.settings, self.ledger, self.replica.index
        self.replica.catch_up(blocking=False)
        t = time.perf_counter()
        vec_hits: dict[int, float] = {}
        if mode != "keyword":
            vec_hits = dict(index.search(shard_name(scope.user_id), vec[None, :], s.vector_k))
        timings["vector"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        records = ledger.by_rowids(list(vec_hits.keys() | kw_hits.keys()), scope)
        missing = [r for r in records if r not in vec_hits and mode != "keyword"]
        for rowid, v in ledger.vectors(missing, index.dim).items():
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
            candidates,
            settings,
            task_type=type_for_task(task or q),
            now=now,
            threshold=threshold,
            include_unverified=include_unverified,
        )
        items, block, tokens = pack(
            scored, budget, max_items=max_items or s.max_items, promote_after=s.promote_after
        )
        timings["score_pack"] = (time.perf_counter() - t) * 1e3
        self._record_usage(items)
        timings["total"] = (time.perf_counter() - t0) * 1e3
        return Recall(q, items, block, scored, tokens, timings)
