"""Server configuration: one pydantic-settings object; every field is `LOOPSTACK_<NAME>`.

Fields left at ``None`` are filled by `loopstack.serving.engine.hardware.vllm_launch` from the
machine (GPU count, memory) so that `make serve` does the right thing on a laptop and on a GPU box.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The CPU default, by the team's rule (docs/benchmarks.md, "The CPU default"): the offline
# model that solves the most golden tasks, provided its p95 step at one agent stays under 30 s
# on a 2-core float32 box and its context holds Codex's and Claude Code's first requests.
OFFLINE_DEFAULT = "offline:qwen2.5-coder-1.5b-instruct"
# The small offline model: what the CPU image bundles (deploy/docker/Dockerfile.cpu) and what
# `make test` checks behaviour on (it starts in a third of the time).
OFFLINE_SMALL = "offline:qwen2.5-coder-0.5b-instruct"
# The GPU default, chosen by the rule in docs/benchmarks.md ("The GPU default"): Qwen3-8B
# (architecture Qwen3ForCausalLM, in the pinned GPU vLLM's model registry: checked by
# tests/unit/serving/test_gpu_engine.py). Thinking is off (tool turns and replies alike) unless
# a request turns it on; its thinking then comes back as `reasoning_content`, never as content.
GPU_DEFAULT = "Qwen/Qwen3-8B"
GPU_DEFAULT_ARCHITECTURE = "Qwen3ForCausalLM"
GPU_DEFAULT_CONTEXT = 32_768  # native; 131,072 only with YaRN rope scaling (not turned on)
# Chat-template arguments of every prompt we render (and the GPU default engine's): no
# thinking. Templates without the switch (Qwen2.5's) ignore it.
NO_THINKING = {"enable_thinking": False}


CpuDtype = Literal["auto", "bfloat16", "float32"]
# How vLLM-CPU lays out its engine (loopstack.serving.engine.hardware.cpu_executor_env): "uni", the
# model's worker inside the engine-core process (no busy-wait between them), or "mp", vLLM-CPU's own
# (a worker process bound to its cores; the engine core spins on their shared-memory queue).
CpuExecutor = Literal["auto", "uni", "mp"]
# How tool calls (and client constraints) are constrained: `loopstack.serving.constraint`.
BackendName = Literal["xgrammar", "guidance", "outlines"]
DEFAULT_BACKEND: BackendName = "guidance"


class ServerSettings(BaseSettings):
    """Everything `loopstack serve` can be told. Env prefix ``LOOPSTACK_``."""

    model_config = SettingsConfigDict(env_prefix="LOOPSTACK_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="How long an idle client connection stays open. Longer than clients' own "
        "idle expiry (httpx and the openai client: 5 s), so a client never sends a request on "
        "a connection the server is closing at that moment (that request fails unanswered).",
    )
    model: str | None = Field(
        default=None,
        description="HF id, local HF folder, local .gguf, or the offline default. "
        "Unset: the offline Qwen 0.5B on CPU, Qwen3-8B on GPU. "
        "offline:qwen2.5-coder-1.5b-instruct: the larger offline model "
        "(loopstack.serving.engine.offline_models).",
    )
    served_model_name: str | None = None
    model_aliases: str = Field(
        default="",
        description="Other model names answered by the served model (clients' defaults: "
        "`claude-*`, `gpt-5`): `name=target,...` or a JSON object, `*` a catch-all, `name*` a "
        "prefix; the target must be the served name (empty: the served name). Other names: 404 "
        "model_not_found (loopstack/serving/http/aliases.py).",
    )
    anthropic_model_names: bool = Field(
        default=True,
        description="Serve every Anthropic model name (`claude-*`: Claude Code's "
        "`claude-haiku-*` background requests) on /v1/messages by the served model, after "
        "LOOPSTACK_MODEL_ALIASES; false: such names need an alias "
        "(loopstack/serving/http/aliases.py).",
    )
    home: Path = Path("~/.cache/loopstack").expanduser()
    api_key: str | None = None

    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_model_len: int | None = None
    cpu_kv_cache_gib: int | None = None
    cpu_block_size: int = Field(
        default=32,
        ge=16,
        description="vLLM-CPU KV-cache block size in tokens (vLLM's CPU default is 128). The "
        "prefix cache keeps whole blocks only: with 128, an agent's every step re-prefills up "
        "to 127 tokens of its previous context; 32 took the agent load test's hit rate from "
        "0.74 to 0.85 and its 16-agent step rate from ~1.0 to 1.46 steps/s (docs/benchmarks.md).",
    )
    cpu_dtype: CpuDtype = Field(
        default="auto",
        description="vLLM-CPU weights dtype. auto: bfloat16 where the CPU computes it natively "
        "(AVX512-BF16 or AMX), else float32 (bf16 emulated on AVX2 prefills ~5x slower).",
    )
    cpu_executor: CpuExecutor = Field(
        default="auto",
        description="vLLM-CPU's engine layout. uni: the worker inside the engine-core process, "
        "computing on LOOPSTACK_CPU_THREADS threads (on a 2-core box: 1.56x the steps/s at 16 "
        "agents and 0.78x the step latency at one, docs/benchmarks.md); mp: vLLM-CPU's own, a "
        "worker process on the cores it binds (VLLM_CPU_OMP_THREADS_BIND) while the engine core "
        "busy-waits on it, a core's worth of CPU under load. auto: uni on boxes of up to 4 "
        "cores (measured on 2), mp above (not measured there).",
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        description="uni: the engine's compute threads (OMP_NUM_THREADS). Default: every core "
        "this process may run on.",
    )
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float = 0.90
    engine_port: int | None = Field(default=None, description="vLLM's internal port (port+1).")
    engine_url: str | None = Field(
        default=None,
        description="Use an already running vLLM OpenAI server at this URL instead of starting "
        "one (it must serve the same model).",
    )
    engine_args: str = Field(default="", description="Extra vLLM CLI arguments, shell-quoted.")
    engine_start_timeout_s: float = 900.0
    # -- engine lifecycle (loopstack.serving.engine.supervisor, loopstack.serving.engine.launcher)
    # --
    engine_api_key: str | None = Field(
        default=None,
        description="Key for an external engine (LOOPSTACK_ENGINE_URL). An engine loopstack "
        "starts itself always gets a fresh random key.",
    )
    engine_restart_timeout_s: float | None = Field(
        default=None,
        description="Limit for the first restart attempt after the engine died (default: the "
        "start timeout); once an attempt has timed out, later ones get the start timeout.",
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        gt=0,
        description="SIGTERM/SIGINT: the process is gone within this many seconds, engine "
        "included, even with stuck requests.",
    )
    regex_compile_timeout_s: int = Field(
        default=60,
        description="vLLM's own limit for compiling one regex constraint "
        "(VLLM_REGEX_COMPILATION_TIMEOUT_S): the outlines backend's regexes, a client's regex "
        "under xgrammar. Every constraint is compiled first by us "
        "(LOOPSTACK_SCHEMA_COMPILE_TIMEOUT_S).",
    )

    max_schema_states: int = Field(
        default=12_000,
        description="outlines backend: largest regex automaton accepted (states); larger "
        "schemas get 400 schema_too_complex instead of minutes of vLLM compilation.",
    )

    max_concurrency: int = Field(default=64, description="Requests generating at once.")
    max_queue: int = Field(default=256, description="Requests waiting; beyond it: 429.")
    retry_after_s: int = 2

    embedding_model: str = "all-MiniLM-L6-v2"

    # -- tool selection for requests that do not say (loopstack.serving.selection.defaults)
    # ------------ None: the default shipped for the served model (SHIPPED there); a request's own
    # `loopstack` fields override each of them.
    tool_rank: bool | None = Field(
        default=None,
        description="Rank the offered tools by relevance to the request (loopstack.tool_rank) "
        "when a request does not say.",
    )
    tool_top_k: int | None = Field(
        default=None, ge=0, le=1024, description="With ranking: offer the k best only (0: all)."
    )
    tool_min_score: float | Literal["off"] | None = Field(
        default=None,
        description="With ranking: offer only tools scoring this or more (off: no floor).",
    )
    tool_abstain: bool | None = Field(
        default=None,
        description="Say in the prompt to call a tool only when the request needs one "
        "(loopstack.abstain).",
    )
    tool_decide: bool | None = Field(
        default=None,
        description="auto turns (guidance backend): a short hidden decision before the call or "
        "the text (loopstack.decide).",
    )
    tool_after_results: bool | None = Field(
        default=None,
        description="When a conversation ends with tool results, say in the prompt to answer "
        "from them (loopstack.after_results).",
    )
    max_tool_tokens: int = Field(default=1024, description="max_tokens default for tool calls.")
    log_level: str = "INFO"

    constraint_backend: BackendName = Field(
        default=DEFAULT_BACKEND,
        description="How tool calls are constrained, and vLLM's structured-output backend. "
        "xgrammar/guidance: one engine request per turn under one grammar; outlines: regexes, "
        "a call in two requests (docs/architecture.md).",
    )

    # -- constraint safety (loopstack/serving/constraint/sandbox.py, schema_limits.py,
    # validation.py) --
    schema_compile_timeout_s: float = Field(
        default=10.0,
        description="Deadline for compiling one constraint first, before the engine sees it (a "
        "turn's or a client's grammar with the model's vocabulary; outlines: a schema's "
        "regex); past it: 400 schema_too_complex.",
    )
    schema_compile_mode: Literal["process", "thread"] = Field(
        default="process",
        description="Where constraints compile: memory-limited worker processes (killed at the "
        "deadline) or a thread (keeps running past it).",
    )
    constraint_probe_timeout_s: float = Field(
        default=5.0,
        description="outlines backend: deadline for measuring a regex's automaton (corpus "
        "schemas: < 0.3 s); past it the constraint gets 400 schema_too_complex.",
    )
    max_schema_depth: int = Field(default=48, description="Deepest JSON nesting of a schema.")
    max_schema_nodes: int = Field(default=20_000, description="Most JSON values in a schema.")
    max_schema_ref_chain: int = Field(default=16, description="Longest chain of $ref to $ref.")
    validation_deadline_s: float = Field(
        default=0.25,
        description="Time one output's jsonschema validation may spend in `pattern` matching "
        "(off the event loop); past it the output counts as invalid.",
    )

    # -- limits at the HTTP edge (loopstack.serving.http.limits); beyond each: an OpenAI-style 4xx
    # ---------
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest request body in bytes; larger: 413, refused while reading.",
    )
    max_messages: int = Field(default=2048, ge=1, description="Messages per chat request.")
    max_tools: int = Field(default=128, ge=1, description="Tools per chat request.")
    max_stop: int = Field(default=16, ge=1, description="Stop sequences per request.")
    max_prompts: int = Field(default=64, ge=1, description="Prompts per /v1/completions call.")
    max_embedding_inputs: int = Field(
        default=2048, ge=1, description="Inputs per /v1/embeddings request."
    )
    max_embedding_input_chars: int = Field(
        default=8192,
        ge=1,
        description="Each embedding input is cut to this many characters (the model reads "
        "only its first 256 tokens).",
    )

    # -- stored responses (loopstack.serving.http.responses.store)
    # ----------------------------------
    responses_db: str | None = Field(
        default=None,
        description="Where /v1/responses keeps stored responses: a postgresql:// URL (replicas "
        "share it) or a SQLite path. Unset: <home>/responses.sqlite3.",
    )
    responses_max_items: int = Field(default=10_000, ge=1, description="Stored responses kept.")
    responses_max_age_s: float = Field(
        default=30 * 86_400.0, gt=0, description="Stored responses older than this are gone."
    )
    responses_max_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest stored response (with history)."
    )

    def engine_port_resolved(self) -> int:
        return self.engine_port if self.engine_port is not None else self.port + 1


T = TypeVar("T")


def setting_default(name: str) -> Any:
    """A setting's default, declared once (in `ServerSettings`): for the dataclasses the
    settings are unpacked into, so a default is never written twice."""
    return ServerSettings.model_fields[name].default


def unpack(cls: type[T], settings: ServerSettings, **names: str) -> T:
    """Dataclass `cls` with each field from the setting of the same name (or `names[field]`):
    settings are unpacked by name, never copied by hand."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: getattr(settings, names.get(f.name, f.name)) for f in fields})
