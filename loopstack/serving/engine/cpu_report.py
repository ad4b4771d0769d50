"""What `loopstack serve` says at start-up about a CPU box: the features found, the dtype they
lead to, and the prompt rate to expect, so a user knows why the box is fast or slow.

vLLM-CPU computes in bfloat16 only where the CPU has native bf16 math (AVX512-BF16 or AMX);
elsewhere (AVX2 only) it runs the model in float32, 2-4x slower per token. The expected rates
are what was measured on 2-core boxes (one core for vLLM's worker, its own layout), per model
and dtype (the issue that added this report, #40, and the offline models' notes); a figure not
measured cleanly is None, and the report says so. Other boxes scale roughly with the cores
that compute.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CpuReport", "cpu_report"]

# (model-name fragment, dtype) -> prompt tokens/s measured on one worker core of a 2-core box
# (None: not measured; the report says so rather than guessing)
PROMPT_RATES: dict[tuple[str, str], tuple[int, int] | None] = {
    ("0.5b", "float32"): (150, 170),  # AMD EPYC, AVX2 only (issue #40's measurement)
    ("0.5b", "bfloat16"): None,  # MEASURE
    ("1.5b", "float32"): (30, 50),  # AMD EPYC, AVX2 only (shared/MODELS.md)
    ("1.5b", "bfloat16"): None,
}

_VECTOR_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")


@dataclass(frozen=True)
class CpuReport:
    features: tuple[str, ...]  # the vector features that matter here, as /proc/cpuinfo names them
    dtype: str
    why: str
    prompt_rate: tuple[int, int] | None

    def lines(self, model: str) -> list[str]:
        found = ", ".join(self.features) or "none of AVX2/AVX-512/AMX"
        out = [f"CPU features: {found}", f"dtype {self.dtype}: {self.why}"]
        if self.prompt_rate is None:
            out.append(f"expected prompt rate for {model}: not measured on this kind of CPU")
        else:
            lo, hi = self.prompt_rate
            out.append(
                f"expected prompt rate for {model}: ~{lo}-{hi} tokens/s on one core "
                f"(a 5,000-token prompt: ~{5000 // hi}-{5000 // lo} s the first time; "
                "a cached prefix is nearly free; the one-process engine computes on every "
                "core: on 2 cores one agent's step took 0.70x the time in float32)"
            )
        return out


def cpu_report(flags: frozenset[str], dtype: str, model: str, *, requested: str) -> CpuReport:
    """The start-up report for a CPU with `flags` serving `model` in `dtype`."""
    features = tuple(f for f in _VECTOR_FEATURES if f in flags)
    native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    if requested != "auto":
        why = f"set by LOOPSTACK_CPU_DTYPE={requested}"
        if requested == "bfloat16" and not native_bf16:
            why += " (no native bf16 math here: vLLM emulates it, several times slower)"
    elif native_bf16:
        why = "native bf16 math (AVX512-BF16/AMX): the fast path"
    else:
        why = "no AVX512-BF16 or AMX: float32, 2-4x slower per token than a bf16 CPU"
    size = next((s for s in ("0.5b", "1.5b") if s in model.lower()), None)
    rate = PROMPT_RATES.get((size, dtype)) if size else None
    return CpuReport(features, dtype, why, rate)
