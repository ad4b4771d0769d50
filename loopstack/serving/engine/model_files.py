"""A model's own files, read without loading it: its ``config.json`` and ``tokenizer.json``.

The engine's command line and the grammar checker need a few facts the model states itself:
its attention heads (the tensor-parallel sizes vLLM accepts), its context length (our own
prompt checks, and ``--max-model-len``) and its vocabulary. They come from the model's files:

* a local folder (the offline default's converted folder, ``LOOPSTACK_MODEL=/path``): read
  there;
* a Hugging Face id (the GPU default, ``Qwen/Qwen3-8B``): from the local HF cache,
  else fetched from the hub - just that file, a few kB (not with ``HF_HUB_OFFLINE=1``).

Nothing here imports torch or transformers. A fact that cannot be read is ``None``, with a
warning; callers fall back to what is safe without it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The config keys vLLM reads a context length from (it takes the smallest one present);
# rope scaling, which some models use to stretch it, is ignored: the length is never longer
# than what vLLM would derive, only possibly shorter.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


@dataclass(frozen=True)
class ModelFacts:
    """What the model's config.json says (``None``: not stated, or not readable)."""

    attention_heads: int | None = None
    kv_heads: int | None = None
    context_len: int | None = None
    vocab_size: int | None = None
    layers: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    tied_embeddings: bool = False

    def parameters(self) -> int | None:
        """The parameter count of a dense decoder, from its shapes (embeddings, attention with
        its KV heads, a gated MLP; norms and biases are noise), or None when a shape is
        unknown. Qwen2.5-Coder-1.5B: 1.54e9 (its card: 1.54B)."""
        h, ff, layers = self.hidden_size, self.intermediate_size, self.layers
        if not (h and ff and layers and self.vocab_size and self.kv_heads and self.head_dim):
            return None
        kv = self.kv_heads * self.head_dim
        attention = h * h * 2 + h * kv * 2  # q and o; k and v
        mlp = 3 * h * ff  # gate, up, down
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return embeddings + layers * (attention + mlp)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int | None:
        """Bytes of KV cache one token takes (keys and values of every layer), or None."""
        if self.layers is None or self.kv_heads is None or self.head_dim is None:
            return None
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_file(path_or_id: str, name: str) -> Path | None:
    """`name` of the model: in its local folder, the HF cache, or fetched from the hub."""
    local = Path(path_or_id).expanduser()
    if local.is_dir():
        found = local / name
        return found if found.is_file() else None
    if local.exists() or path_or_id.count("/") != 1:
        return None  # a file (a .gguf is converted to a folder first), or no hub id
    try:
        import huggingface_hub as hub

        cached = hub.try_to_load_from_cache(path_or_id, name)
        if isinstance(cached, str):
            return Path(cached)
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
            return None
        return Path(hub.hf_hub_download(path_or_id, name, etag_timeout=10))
    except Exception as exc:  # no network, no such repo, gated: the caller's fallback
        logger.warning("could not read %s of %s: %s", name, path_or_id, exc)
        return None


def _int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def facts_from_config(config: dict[str, Any]) -> ModelFacts:
    """The facts of a parsed config.json (a multimodal model's ``text_config`` counts)."""
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}
    heads = _int(config, "num_attention_heads") or _int(config, "n_head")
    lengths = [n for key in CONTEXT_KEYS if (n := _int(config, key)) is not None]
    hidden = _int(config, "hidden_size")
    head_dim = _int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    return ModelFacts(
        attention_heads=heads,
        kv_heads=_int(config, "num_key_value_heads") or heads,
        context_len=min(lengths) if lengths else None,
        vocab_size=_int(config, "vocab_size"),
        layers=_int(config, "num_hidden_layers") or _int(config, "n_layer"),
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size"),
        tied_embeddings=config.get("tie_word_embeddings") is True,
    )


def read_facts(path_or_id: str) -> ModelFacts:
    """The model's facts; all ``None`` when its config.json cannot be read."""
    path = model_file(path_or_id, "config.json")
    if path is None:
        logger.warning("no config.json for %s: its heads and context length are unknown",
                       path_or_id)  # fmt: skip
        return ModelFacts()
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        logger.warning("could not parse %s: %s", path, exc)
        return ModelFacts()
    return facts_from_config(config) if isinstance(config, dict) else ModelFacts()


def tokenizer_folder(path_or_id: str) -> str:
    """A folder holding the model's ``tokenizer.json`` (the grammar checker reads that file,
    not transformers, which would import torch), or `path_or_id` itself when there is none."""
    path = model_file(path_or_id, "tokenizer.json")
    return str(path.parent) if path is not None else path_or_id
