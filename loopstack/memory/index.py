"""The FAISS side: one vector shard per user, persisted beside the ledger.

Why one shard per user: a query only ever touches its own user's vectors, so isolation does
not depend on post-filtering a global top-k (the ledger re-checks the scope anyway), and a
small user's recall is not starved by a big one.

A shard is exact (``IndexIDMap2(IndexFlatIP)``) until it holds ``hnsw_threshold`` vectors,
then it is rebuilt as HNSW (``IndexIDMap2(IndexHNSWFlat)``, inner product). HNSW cannot
``remove_ids``, so removals there are tombstones filtered at search time; the shard is
rebuilt when tombstones pass a quarter of it. FAISS ids are the ledger's rowids
(AUTOINCREMENT, never reused).

Persistence: ``<dir>/<shard>.<seq>.faiss`` (+ ``.tomb.npy``), where ``seq`` is the last
ledger change the file includes. On open each shard replays the change log after its own
``seq``, so a stale or missing file catches up by itself, exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import faiss as _faiss
import numpy as np
import numpy.typing as npt

from loopstack.memory.embedding import Vectors
from loopstack.memory.exceptions import IndexMismatchError

__all__ = ["FlatShard", "HnswShard", "ShardedIndex", "VectorIndex", "shard_name"]

logger = logging.getLogger(__name__)

# faiss's bundled stubs miss much of the SWIG surface used here (get_xb, SearchParametersHNSW).
faiss: Any = _faiss

IdArray = npt.NDArray[np.int64]

# faiss 1.15 uses a slow non-BLAS path for batches of fewer than 20 queries by default.
faiss.cvar.distance_compute_blas_threshold = 20


class VectorIndex(Protocol):
    """What the store needs from one shard."""

    kind: str

    def __len__(self) -> int: ...

    def add(self, ids: IdArray, vectors: Vectors) -> None: ...

    def remove(self, ids: Sequence[int]) -> None: ...

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]: ...

    def vectors(self) -> tuple[IdArray, Vectors]: ...


def shard_name(user_id: str) -> str:
    return hashlib.sha256(user_id.encode()).hexdigest()[:24]


#: A temporary file older than this is left over from a killed process, not being written.
_STALE_TMP_S = 600.0


def _tmp(final: Path, suffix: str = ".tmp") -> Path:
    """A temporary name for ``final`` that no other process or thread writes (two processes
    saving the same shard at the same seq would otherwise share one temporary file)."""
    return final.with_name(f"{final.name}.{os.getpid()}-{threading.get_ident()}{suffix}")


def _in_flight(f: Path) -> bool:
    """Whether ``f`` is a temporary file another writer may still rename into place."""
    if ".tmp" not in f.name:
        return False
    try:
        return time.time() - f.stat().st_mtime < _STALE_TMP_S
    except FileNotFoundError:
        return False


class FlatShard:
    """Exact inner-product search with real deletes."""

    kind = "flat"

    def __init__(self, dim: int, index: Any = None) -> None:
        self.dim = dim
        self.index = index if index is not None else faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, ids: IdArray, vectors: Vectors) -> None:
        if len(ids):
            self.index.add_with_ids(np.ascontiguousarray(vectors), np.asarray(ids, np.int64))

    def remove(self, ids: Sequence[int]) -> None:
        if ids:
            self.index.remove_ids(np.asarray(list(ids), dtype=np.int64))

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        if self.index.ntotal == 0 or k <= 0:
            return []
        scores, ids = self.index.search(query, min(k, int(self.index.ntotal)))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def vectors(self) -> tuple[IdArray, Vectors]:
        n = int(self.index.ntotal)
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        flat = faiss.downcast_index(self.index.index)
        vecs = faiss.rev_swig_ptr(flat.get_xb(), n * self.dim).reshape(n, self.dim).copy()
        return ids, vecs


class HnswShard:
    """Approximate search (HNSW) with tombstones for removals."""

    kind = "hnsw"

    def __init__(
        self,
        dim: int,
        *,
        m: int = 32,
        ef_construction: int = 40,
        ef_search: int = 96,
        index: Any = None,
        tombstones: set[int] | None = None,
    ) -> None:
        self.dim = dim
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        if index is None:
            hnsw = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = ef_construction
            index = faiss.IndexIDMap2(hnsw)
        self.index = index
        self._hnsw = faiss.downcast_index(index.index)
        self._hnsw.hnsw.efSearch = ef_search
        self.tombstones: set[int] = tombstones or set()

    def __len__(self) -> int:
        return int(self.index.ntotal) - len(self.tombstones)

    def add(self, ids: IdArray, vectors: Vectors) -> None:
        if len(ids):
            self.index.add_with_ids(np.ascontiguousarray(vectors), np.asarray(ids, np.int64))

    def remove(self, ids: Sequence[int]) -> None:
        """Tombstone the ids that are really in the graph (so ``len`` stays exact)."""
        wanted = np.asarray(list(ids), dtype=np.int64)
        if not len(wanted):
            return
        present = faiss.vector_to_array(self.index.id_map)
        self.tombstones.update(int(i) for i in wanted[np.isin(wanted, present)])

    @property
    def needs_rebuild(self) -> bool:
        return len(self.tombstones) > 0.25 * max(1, int(self.index.ntotal))

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        if self.index.ntotal == 0 or k <= 0:
            return []
        extra = min(len(self.tombstones), 4 * k)
        want = min(k + extra, int(self.index.ntotal))
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(self.ef_search, want)
        scores, ids = self.index.search(query, want, params=params)
        out = [
            (int(i), float(s))
            for i, s in zip(ids[0], scores[0], strict=True)
            if i >= 0 and int(i) not in self.tombstones
        ]
        return out[:k]

    def vectors(self) -> tuple[IdArray, Vectors]:
        n = int(self.index.ntotal)
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        vecs = self._hnsw.reconstruct_n(0, n) if n else np.zeros((0, self.dim), np.float32)
        keep = np.array([int(i) not in self.tombstones for i in ids], dtype=bool)
        return ids[keep], np.ascontiguousarray(vecs[keep], dtype=np.float32)


Shard = FlatShard | HnswShard


class ShardedIndex:
    """All users' shards, their files, and the ledger sequence each one has applied."""

    def __init__(
        self,
        directory: str | Path,
        *,
        dim: int,
        model: str,
        kind: str = "auto",
        hnsw_threshold: int = 20_000,
        hnsw_m: int = 32,
        hnsw_ef_construction: int = 40,
        hnsw_ef_search: int = 96,
    ) -> None:
        self.dir = Path(directory)
        self.dim = dim
        self.model = model
        self.kind = kind
        self.hnsw_threshold = hnsw_threshold
        self.hnsw_m = hnsw_m
        self.hnsw_ef_construction = hnsw_ef_construction
        self.ef_search = hnsw_ef_search
        self.shards: dict[str, Shard] = {}
        self.seqs: dict[str, int] = {}  # shard name -> last applied change seq
        self.dirty: set[str] = set()
        self.locks: dict[str, threading.RLock] = {}
        self._meta_lock = threading.Lock()

    # --- shard helpers -----------------------------------------------------------------
    def _new_shard(self, n_expected: int) -> Shard:
        use_hnsw = self.kind == "hnsw" or (self.kind == "auto" and n_expected > self.hnsw_threshold)
        if use_hnsw:
            return self._new_hnsw()
        return FlatShard(self.dim)

    def _new_hnsw(self) -> HnswShard:
        return HnswShard(
            self.dim,
            m=self.hnsw_m,
            ef_construction=self.hnsw_ef_construction,
            ef_search=self.ef_search,
        )

    def lock(self, name: str) -> threading.RLock:
        with self._meta_lock:
            return self.locks.setdefault(name, threading.RLock())

    def shard(self, name: str) -> Shard | None:
        return self.shards.get(name)

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards.values())

    # --- mutation (callers hold lock(name)) ----------------------------------------------
    def add(self, name: str, ids: IdArray, vectors: Vectors, seq: int) -> None:
        shard = self.shards.get(name)
        if shard is None:
            shard = self.shards[name] = self._new_shard(len(ids))
        shard.add(ids, vectors)
        if (
            self.kind == "auto"
            and isinstance(shard, FlatShard)
            and len(shard) > self.hnsw_threshold
        ):
            self.shards[name] = self._rebuilt(shard, hnsw=True)
        self.seqs[name] = max(self.seqs.get(name, 0), seq)
        self.dirty.add(name)

    def remove(self, name: str, ids: Sequence[int], seq: int) -> None:
        shard = self.shards.get(name)
        if shard is not None:
            shard.remove(ids)
            if isinstance(shard, HnswShard) and shard.needs_rebuild:
                self.shards[name] = self._rebuilt(shard, hnsw=len(shard) > self.hnsw_threshold)
        self.seqs[name] = max(self.seqs.get(name, 0), seq)
        self.dirty.add(name)

    def _rebuilt(self, shard: Shard, *, hnsw: bool) -> Shard:
        ids, vecs = shard.vectors()
        new: Shard = self._new_hnsw() if hnsw or self.kind == "hnsw" else FlatShard(self.dim)
        logger.info("rebuilding a shard of %d vectors as %s", len(ids), new.kind)
        new.add(ids, vecs)
        return new

    def search(self, name: str, query: Vectors, k: int) -> list[tuple[int, float]]:
        shard = self.shards.get(name)
        if shard is None:
            return []
        with self.lock(name):
            return shard.search(query, k)

    def clear(self) -> None:
        self.shards.clear()
        self.seqs.clear()
        self.dirty.clear()

    # --- persistence ---------------------------------------------------------------------
    def _manifest(self) -> Path:
        return self.dir / "manifest.json"

    def load(self) -> set[str]:
        """Read every shard file (newest ``seq`` per shard). Missing files mean seq 0.
        Returns the shards whose file could not be read: the caller rebuilds them from the
        ledger (their changes may be gone from the trimmed log)."""
        self.clear()
        if not self.dir.exists():
            return set()
        meta = self._read_manifest()
        if meta:
            if meta.get("dim") != self.dim or meta.get("model") != self.model:
                raise IndexMismatchError(
                    f"index at {self.dir} was built by {meta.get('model')}/{meta.get('dim')}-d,"
                    f" the store uses {self.model}/{self.dim}-d: run `loopstack memory reindex`"
                )
        unreadable: set[str] = set()
        for name, (seq, f) in self.files().items():
            for _ in range(3):
                try:
                    self.shards[name] = self._read(f)
                    self.seqs[name] = seq
                    break
                except (RuntimeError, OSError, ValueError) as exc:
                    # Another process may just have replaced it by a newer file: read that.
                    again = self.files(name).get(name)
                    if again is None or again == (seq, f):
                        logger.warning("unreadable shard %s (%s): rebuilding it", f, exc)
                        break
                    seq, f = again
            if name not in self.shards:
                unreadable.add(name)
        return unreadable

    def files(self, name: str = "*") -> dict[str, tuple[int, Path]]:
        """The newest file of each shard on disk (of ``name`` only, if given): (seq, path)."""
        newest: dict[str, tuple[int, Path]] = {}
        for f in self.dir.glob(f"{name}.*.faiss"):
            shard, _, seq_s = f.stem.partition(".")
            if seq_s.isdigit() and int(seq_s) >= newest.get(shard, (-1, f))[0]:
                newest[shard] = (int(seq_s), f)
        return newest

    def _read(self, f: Path) -> Shard:
        raw = faiss.read_index(str(f))
        inner = faiss.downcast_index(raw.index)
        if not isinstance(inner, faiss.IndexHNSWFlat):
            return FlatShard(self.dim, index=raw)
        tomb_f = f.with_suffix(".tomb.npy")
        tomb = set(np.load(tomb_f).tolist()) if tomb_f.exists() else set()
        return HnswShard(
            self.dim,
            m=self.hnsw_m,
            ef_construction=self.hnsw_ef_construction,
            ef_search=self.ef_search,
            index=raw,
            tombstones=tomb,
        )

    def write_manifest(self, synced_seq: int) -> None:
        """Record which model built the files and that they hold every change through
        ``synced_seq`` (the ledger may trim its log up to there). A process behind another
        does not lower it: files only get newer, so the higher mark stays true."""
        self.dir.mkdir(parents=True, exist_ok=True)
        synced_seq = max(synced_seq, self.synced_seq())
        manifest = self._manifest()
        tmp = _tmp(manifest)
        meta = {"dim": self.dim, "model": self.model, "version": 1, "synced_seq": synced_seq}
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, manifest)

    def _read_manifest(self) -> dict[str, Any]:
        """The manifest on disk; empty when there is none (or it cannot be read)."""
        try:
            meta = json.loads(self._manifest().read_text())
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def synced_seq(self) -> int:
        """``synced_seq`` of the manifest on disk (0 when there is none)."""
        return int(self._read_manifest().get("synced_seq", 0))

    def save(self, names: Sequence[str] | None = None) -> int:
        """Write dirty shards (atomically, new file then remove older ones). Other processes
        may save the same shards meanwhile: each writes its own temporary files, and the
        clean-up leaves the ones still being written."""
        self.dir.mkdir(parents=True, exist_ok=True)
        todo = list(self.dirty if names is None else set(names) & self.dirty)
        for name in todo:
            with self.lock(name):
                shard = self.shards.get(name)
                seq = self.seqs.get(name, 0)
                if shard is None:
                    continue
                final = self.dir / f"{name}.{seq}.faiss"
                tmp = _tmp(final)
                faiss.write_index(shard.index, str(tmp))
                if isinstance(shard, HnswShard) and shard.tombstones:
                    tomb_tmp = _tmp(final.with_suffix(".tomb"), ".tmp.npy")
                    np.save(tomb_tmp, np.fromiter(shard.tombstones, dtype=np.int64))
                    os.replace(tomb_tmp, final.with_suffix(".tomb.npy"))
                os.replace(tmp, final)
                self.dirty.discard(name)
            for old in self.dir.glob(f"{name}.*"):
                parts = old.name.split(".")
                if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < seq:
                    if not _in_flight(old):
                        old.unlink(missing_ok=True)
        return len(todo)

    def wipe(self) -> None:
        """Remove every shard file (before a full rebuild)."""
        self.clear()
        if self.dir.exists():
            for f in self.dir.iterdir():
                if f.is_file():
                    f.unlink()
