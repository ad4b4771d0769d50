"""A model's architecture as the replica model needs it, read from a Hugging Face
``config.json``: layers, hidden size, heads, KV heads, head size, MLP size, experts.

``load_architecture(spec)`` takes a local folder (or file) with a ``config.json`` (read as
is), or a Hugging Face id: there is no hub at plan time, so the ids of the architectures
shipped under ``loopstack/bench/load/data/architectures/`` (their config.json fields, each file
naming the model card it was copied from) are answered from there.

The counts (hand-checkable; `tests/unit/bench/test_gpu_roofline.py` does):

    attention per layer  = h*(nh*d) + 2*h*(nkv*d) + (nh*d)*h        (q, k, v, o; no biases)
    dense MLP per layer  = 3*h*I                                     (gate, up, down)
    MoE per layer        = E*3*h*Im + h*E   (all experts + router);  active k*3*h*Im + h*E
    embeddings           = V*h, the LM head another V*h unless tied
    KV bytes per token   = 2 * L * nkv * d * bytes(kv dtype)

Norms and biases (well under 0.1 % of the weights) are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopstack.bench.load import BenchError

DATA = Path(__file__).parent / "data" / "architectures"


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP size (per expert for Mixtral-style MoE)
    vocab: int
    tied_embeddings: bool = False
    experts: int = 0  # 0: dense
    experts_per_token: int = 0
    expert_intermediate: int = 0
    moe_layers: int = 0  # layers whose MLP is the MoE
    dtype: str = "bf16"
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # -- parameters ------------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * q + 2 * self.hidden * kv + q * self.hidden

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts

    def layer_params(self, active: bool = False) -> int:
        """Parameters of all layers (``active``: those one token multiplies)."""
        dense_layers = self.layers - self.moe_layers
        total = self.layers * self.attention_params + dense_layers * self.dense_mlp_params
        n_exp = self.experts_per_token if active else self.experts
        total += self.moe_layers * (n_exp * self.expert_params + self.router_params)
        return total

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden  # a tied head is the same matrix, read again

    @property
    def total_params(self) -> int:
        head = 0 if self.tied_embeddings else self.lm_head_params
        return self.layer_params() + self.embedding_params + head

    @property
    def active_params(self) -> int:
        """Weights one token's forward pass multiplies (no embedding lookup)."""
        return self.layer_params(active=True) + self.lm_head_params

    def kv_bytes_per_token(self, kv_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes

    def describe(self) -> str:
        moe = (
            f", MoE {self.experts} experts x {self.expert_intermediate} "
            f"(top-{self.experts_per_token})"
            if self.is_moe
            else f", MLP {self.intermediate}"
        )
        return (
            f"{self.name}: {self.layers} layers, hidden {self.hidden}, {self.heads} heads / "
            f"{self.kv_heads} KV heads x {self.head_dim}{moe}; {self.total_params / 1e9:.2f} B "
            f"parameters ({self.active_params / 1e9:.2f} B active a token)"
        )


def from_config(cfg: dict[str, Any], name: str = "", source: str = "") -> Architecture:
    """An `Architecture` from a config.json's fields (Llama, Qwen2/3, Mistral, Mixtral and
    Qwen3-MoE naming)."""
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError(f"config.json lacks a field the plan needs: {exc}") from exc
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    intermediate = int(cfg.get("intermediate_size") or 4 * hidden)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    per_tok = int(cfg.get("num_experts_per_tok") or 0)
    moe_layers, expert_inter = 0, 0
    if experts:
        # Qwen3-MoE: moe_intermediate_size, every decoder_sparse_step-th layer not listed in
        # mlp_only_layers; Mixtral: every layer, intermediate_size per expert
        expert_inter = int(cfg.get("moe_intermediate_size") or intermediate)
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        if not per_tok:
            raise BenchError("an MoE config.json without num_experts_per_tok")
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(
        str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), "bf16"
    )
    return Architecture(
        name=name or str(cfg.get("_hf_id") or (cfg.get("architectures") or ["model"])[0]),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        experts=experts,
        experts_per_token=per_tok,
        expert_intermediate=expert_inter,
        moe_layers=moe_layers,
        dtype=dtype,
        source=source or str(cfg.get("_source") or ""),
    )


def shipped() -> dict[str, Path]:
    """Hugging Face ids (and aliases, lower case) -> the vendored config.json figures."""
    out: dict[str, Path] = {}
    for p in sorted(DATA.glob("*.json")):
        cfg = json.loads(p.read_text())
        for key in [cfg.get("_hf_id", ""), *cfg.get("_aliases", []), p.stem]:
            if key:
                out[str(key).lower()] = p
    return out


def load_architecture(spec: str) -> Architecture:
    """A local folder or config.json path, else a shipped Hugging Face id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot read {path}: {exc}") from exc
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "torch_dtype": cfg.get("torch_dtype")}
        return from_config(cfg, name=str(path.parent.name), source=str(path))
    known = shipped()
    hit = known.get(spec.strip().lower())
    if hit is None:
        raise BenchError(
            f"no config.json for {spec!r}: pass a local model folder (no hub at plan time) "
            f"or one of the shipped ids: {', '.join(sorted(k for k in known if '/' in k))}"
        )
    cfg = json.loads(hit.read_text())
    return from_config(cfg, name=str(cfg.get("_hf_id") or spec))
