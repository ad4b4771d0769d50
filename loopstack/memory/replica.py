"""``IndexReplica``: keeps the FAISS index a faithful copy of the ledger.

The ledger's ``changes`` table is an append-only log of ``add``/``del`` by rowid. The
replica replays it into the per-user shards (``loopstack.memory.index``), each shard remembering the
last ``seq`` it has seen, so a replay after a crash applies every change exactly once:

* after each write the writer calls :meth:`catch_up` (the index trails the ledger by at
  most one transaction, and is never ahead of it); the writer also calls it inside its
  ``BEGIN IMMEDIATE`` transaction, where the replay is complete, so its duplicate and
  supersede candidates are the ledger's active records;
* a reader calls ``catch_up(blocking=False)``: it picks up another process's writes, but
  never waits while this process's writer is replaying;
* :meth:`persist` writes dirty shards and then trims the log up to what every shard file
  already contains (``compacted_upto`` in the ledger's meta, raised in the same
  transaction). Log seqs are consecutive, so a replica sees in the log itself when the
  part after its position was trimmed (by another process): it reloads the shard files,
  and rebuilds from the ledger when the files do not reach the trimmed part (issue #10).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Embedder
from loopstack.memory.index import ShardedIndex, shard_name
from loopstack.memory.ledger.backend import LedgerBackend
from loopstack.memory.ledger.rows import Change

__all__ = ["IndexReplica"]

logger = logging.getLogger(__name__)


class IndexReplica:
    """The ledger-to-index replay loop, its persistence and full rebuilds."""

    def __init__(
        self, ledger: LedgerBackend, index: ShardedIndex, settings: MemorySettings
    ) -> None:
        self.ledger = ledger
        self.index = index
        self.settings = settings
        self.applied = 0
        self.lock = threading.Lock()
        self._since_save = 0
        self._last_save = time.monotonic()
        self._save_cost = 0.0

    def catch_up(self, *, force: bool = False, blocking: bool = True) -> int:
        """Replay ledger changes the index has not seen. Returns how many were applied."""
        if not self.lock.acquire(blocking=blocking):
            return 0  # a writer is replaying right now; readers do not wait for it
        try:
            ledger = self.ledger
            top = ledger.max_seq()
            if top <= self.applied and not force:
                return 0
            changes = ledger.changes_since(self.applied)
            first = changes[0].seq if changes else top + 1
            if first > self.applied + 1:
                # The log was trimmed past us (another process saved its shards and
                # compacted): what we have not applied is only in the shard files now.
                logger.info("change log trimmed past seq %d: reloading the index", self.applied)
                reloaded = self._reload()
                if reloaded is None:
                    self._rebuild_from_ledger()
                    return len(self.index)
                changes = reloaded
            self._apply(changes)
            self.applied = max(self.applied, top, *(c.seq for c in changes[-1:]))
            self._since_save += len(changes)
            return len(changes)
        finally:
            self.lock.release()

    def _reload(self) -> list[Change] | None:
        """Load the shard files; returns the retained log to replay on top of them, or None
        when they do not hold every trimmed change (a file unreadable, or the manifest not
        reaching the log). The caller holds ``lock``."""
        synced = self.index.synced_seq()  # read first: the files loaded next hold this much
        unreadable = self.index.load()
        changes = self.ledger.changes_since(0)
        first = changes[0].seq if changes else self.ledger.max_seq() + 1
        if unreadable or synced < first - 1:
            return None
        self.applied = first - 1
        return changes

    def _apply(self, changes: Sequence[Change]) -> None:
        index = self.index
        per_shard: dict[str, list[Change]] = {}
        for ch in changes:
            name = shard_name(ch.user_id)
            if ch.seq > index.seqs.get(name, 0):
                per_shard.setdefault(name, []).append(ch)
        for name, chs in per_shard.items():
            add_ids = [c.rowid for c in chs if c.op == "add"]
            vecs = self.ledger.vectors(add_ids, index.dim) if add_ids else {}
            live = set(self.ledger.active_rowids(list(vecs)))
            ids = np.array([i for i in add_ids if i in live], dtype=np.int64)
            skipped = set(add_ids) - live  # added then removed within this replay
            dels = [c.rowid for c in chs if c.op == "del" and c.rowid not in skipped]
            seq = chs[-1].seq
            with index.lock(name):
                if len(ids):
                    index.add(name, ids, np.stack([vecs[int(i)] for i in ids]), seq)
                index.remove(name, dels, seq)

    def open(self) -> None:
        """Load the shard files and replay the log after them; rebuild from the ledger when
        the files do not reach the trimmed log, or when the counts disagree."""
        with self.lock:
            changes = self._reload()
            if changes:
                self._apply(changes)
                self.applied = changes[-1].seq
        if changes is None:
            logger.warning("index files predate the trimmed change log: rebuilding")
            self.rebuild()
            return
        active, indexed = self.ledger.count(), len(self.index)
        if active != indexed:
            logger.warning("index holds %d vectors, ledger %d records: rebuilding", indexed, active)
            self.rebuild()

    def persist(self, *, force: bool = False) -> bool:
        """Save dirty shards when enough changed, and not more often than saving costs
        (a big HNSW shard takes seconds to write). Returns whether it saved."""
        s = self.settings
        elapsed = time.monotonic() - self._last_save
        if not force and (self._since_save < s.persist_every or elapsed < 10 * self._save_cost):
            return False
        t0 = time.monotonic()
        with self.lock:
            self.index.save()
            upto = self.applied  # every shard is saved through here; older log is redundant
            if not self.index.dirty:
                self.index.write_manifest(upto)
                if upto > 0:
                    self.ledger.compact_changes(upto)  # and compacted_upto, in one transaction
        self._save_cost = time.monotonic() - t0
        self._last_save, self._since_save = time.monotonic(), 0
        return True

    async def reembed(self, embedder: Embedder) -> None:
        """Embed every stored text again (after a model change); call :meth:`rebuild` next.
        The ledger reads and writes run in worker threads, never on the event loop."""
        ledger, last = self.ledger, 0
        while True:
            rows = await asyncio.to_thread(ledger.texts_after, last, 512)
            if not rows:
                break
            vecs = await embedder.embed([text for _, text in rows])
            pairs = [(rowid, v) for (rowid, _), v in zip(rows, vecs, strict=True)]
            await asyncio.to_thread(ledger.set_vectors, pairs)
            last = rows[-1][0]
        await asyncio.to_thread(ledger.set_meta, "embedder", f"{embedder.name}:{embedder.dim}")

    def rebuild(self) -> dict[str, Any]:
        """Drop every shard file and rebuild all shards from the ledger's stored vectors."""
        t0 = time.perf_counter()
        with self.lock:
            self.index.wipe()
            self._rebuild_from_ledger()
        self.persist(force=True)
        return {
            "vectors": len(self.index),
            "shards": len(self.index.shards),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def _rebuild_from_ledger(self) -> None:
        """Every shard from the ledger's stored vectors, in memory (the next :meth:`persist`
        writes them). A shard left without records stays, empty, so its file is replaced.
        The caller holds ``lock``; may run inside a ledger write (it only reads)."""
        index, ledger = self.index, self.ledger
        before = set(index.shards) | set(index.files())
        index.clear()
        top = ledger.max_seq()
        for user_id, ids, vecs in ledger.active_vectors(index.dim):
            name = shard_name(user_id)
            with index.lock(name):
                index.add(name, ids, vecs, top)
        empty = np.zeros((0, index.dim), dtype=np.float32)
        for name in before - set(index.shards):
            index.add(name, np.zeros(0, dtype=np.int64), empty, top)
        self.applied = top
