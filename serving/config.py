"""Server configuration: one pydantic-settings object; every field is `LOOPSTACK_<NAME>`.

Fields left at ``None`` are filled by `serving.hardware.vllm_launch` from the machine (GPU
count, memory) so that `make serve` does the right thing on a laptop and on a GPU box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

OFFLINE_DEFAULT = "offline:qwen2.5-coder-0.5b-instruct"
GPU_DEFAULT = "Qwen/Qwen2.5-7B-Instruct"


class ServerSettings(BaseSettings):
    """Everything `loopstack serve` can be told. Env prefix ``LOOPSTACK_``."""

    model_config = SettingsConfigDict(env_prefix="LOOPSTACK_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = Field(
        default=None,
        description="HF id, local HF folder, local .gguf, or the offline default. "
        "Unset: the offline Qwen 0.5B on CPU, Qwen2.5-7B-Instruct on GPU.",
    )
    served_model_name: str | None = None
    home: Path = Path("~/.cache/loopstack").expanduser()
    api_key: str | None = None

    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_model_len: int | None = None
    cpu_kv_cache_gib: int | None = None
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
    # -- engine lifecycle (serving.engine, serving.launcher) --
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
        default=60, description="vLLM's limit for compiling one constraint (Outlines index)."
    )

    max_schema_states: int = Field(
        default=12_000,
        description="Largest constraint automaton accepted (states); larger schemas get 400 "
        "schema_too_complex instead of minutes of vLLM compilation.",
    )

    max_concurrency: int = Field(default=64, description="Requests generating at once.")
    max_queue: int = Field(default=256, description="Requests waiting; beyond it: 429.")
    retry_after_s: int = 2

    embedding_model: str = "all-MiniLM-L6-v2"
    max_tool_tokens: int = Field(default=1024, description="max_tokens default for tool calls.")
    log_level: str = "INFO"

    def engine_port_resolved(self) -> int:
        return self.engine_port if self.engine_port is not None else self.port + 1
