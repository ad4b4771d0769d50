"""One replica's scheduler iteration from hardware and model: the roofline terms and the few
coefficients put on them.

The CPU plan (`loopstack.bench.load.simulate.EngineModel`) prices an iteration as a fixed part, a
part per decoding sequence and a part per uncached prompt token, fitted on this box's sweep. The GPU
replica model is that same iteration with each part derived instead of fitted:

    linear layers  = FLOPs / (peak x compute_eff) + weight bytes / (bandwidth x bandwidth_eff)
    attention      = max(FLOPs / (peak x compute_eff), KV bytes read / (bandwidth x bandwidth_eff))
    iteration      = linear layers + attention + TP all-reduces + step_s
    one request    + request_s + request_token_s x prompt tokens   (API, tokenising: TTFT, e2e)

    FLOPs(linear)  = 2 x active layer parameters x (decode tokens + prefill tokens)
                     + 2 x LM head x (sequences that sample a token)
    FLOPs(attn)    = 4 x layers x heads x head_dim x (context tokens attended)
    weight bytes   = all layer weights (MoE: the experts a batch touches, E x (1 - (1-k/E)^T)
                     per layer for T tokens) + the LM head, at the weights' dtype
    all-reduce     = 2 per layer, ring: 2 (tp-1)/tp x tokens x hidden x 2 bytes / link + 8 us

The linear layers' two terms add rather than overlap: BLIS's fit on real H100 runs (a fixed
beta0 a step, about the weight read, plus beta1 a prefill token) says so. FP8 GEMMs run at
``fp8_speedup`` x the bf16 peak, not the datasheet's 2x: the ratio of BLIS's prefill cost a
token, bf16 over FP8 checkpoint, for the two models it fitted both ways on an H100 (phi-4
47.41 / 39.93 us = 1.19, Qwen2.5-7B 19.87 / 13.24 us = 1.50; geometric mean 1.33).

`linearised` turns it back into the CPU form at a batch, so both plans read the same three
costs. The coefficients: ``compute_eff`` from BLIS's published prefill cost per token for
Llama-3.1-8B on an H100 (its beta1), ``bandwidth_eff`` from a published A100 decode at one
request, the per-request costs from BLIS's alpha0/alpha1: none of them from the runs the
validation predicts (`loopstack.bench.load.published`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from loopstack.bench.load import BenchError
from loopstack.bench.load.architecture import Architecture
from loopstack.bench.load.hardware import Hardware, dtype_bytes

ALLREDUCE_LATENCY_S = 8e-6  # one NCCL all-reduce of a small message (order of magnitude)
ACTIVATION_RESERVE = 2.0e9  # bytes per GPU kept for activations and CUDA graphs (assumed)

# Published figures the coefficients are fitted on (none is predicted by the validation):
# BLIS (inference-sim/inference-sim, defaults.yaml @ 1a6eb353412e981dba604fccd5096da4e8aee6da),
# meta-llama/llama-3.1-8b-instruct, H100, TP 1, vLLM 0.8.4, fitted by BLIS on its own runs:
BLIS_H100_LLAMA8B_BETA1_S = 17.25086436834028e-6  # seconds per uncached prefill token
BLIS_H100_LLAMA8B_ALPHA0_S = 232.46191091038054e-6  # per request
BLIS_H100_LLAMA8B_ALPHA1_S = 1.752360364195244e-6  # per prompt token
# johnmusgrave.com/p/vllm-throughput-latency-sweep-on: Llama-3.1-8B-Instruct bf16, vLLM
# 0.23.0, one A100 40GB, 1,024 prompt + 128 output tokens, concurrency 1: "about 75 tokens/sec"
A100_40GB_LLAMA8B_DECODE_TOK_S = 75.0
A100_40GB_LLAMA8B_CONTEXT = 1024 + 64
# BLIS defaults.yaml (same commit), H100 TP 1, beta1 (us a prefill token) bf16 / FP8-dynamic:
# microsoft/phi-4 47.40944867621954 / redhatai/phi-4-fp8-dynamic 39.93059807835496;
# qwen/qwen2.5-7b-instruct 19.870256563814962 / redhatai/...-fp8-dynamic 13.241358822784033
FP8_SPEEDUP = (
    (47.40944867621954 / 39.93059807835496) * (19.870256563814962 / 13.241358822784033)
) ** 0.5


@dataclass(frozen=True)
class Coefficients:
    compute_eff: float
    bandwidth_eff: float
    step_s: float = 0.0
    request_s: float = 0.0
    request_token_s: float = 0.0
    fp8_speedup: float = 2.0  # FP8 GEMMs over the bf16 peak (the datasheets' ratio: 2)
    fitted_on: str = ""

    def describe(self) -> str:
        return (
            f"compute {self.compute_eff:.2f} x peak, bandwidth {self.bandwidth_eff:.2f} x peak, "
            f"{self.step_s * 1e3:.2f} ms a step, {self.request_s * 1e3:.2f} ms + "
            f"{self.request_token_s * 1e6:.2f} us/prompt token a request"
        )


def vllm_server_defaults(hw: Hardware) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that ``vllm serve`` picks for a GPU when neither
    is set: vLLM's ``EngineArgs`` (engine/arg_utils.py, V1, 0.8-0.10 and later) gives the
    OpenAI server 8192 tokens and 1024 sequences on a GPU of 70 GiB or more that is not an
    A100 ("Setting large max_num_batched_tokens for A100 reduces throughput", PR #17885), and
    2048 tokens and 256 sequences on every other GPU (an RTX 4090, an L40S, an A100)."""
    if hw.mem_bytes >= 70 * 2**30 and "a100" not in hw.name.lower():
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: ``tp`` GPUs of ``hardware`` serving ``arch``."""

    hardware: Hardware
    arch: Architecture
    tp: int = 1
    weights: str = "bf16"  # dtype of the weights (fp8: W8A8 where the GPU has FP8 cores)
    kv: str = "bf16"  # dtype of the KV cache
    gpu_memory_utilization: float = 0.9  # vLLM's default
    token_budget: int = 0  # max_num_batched_tokens; 0: vLLM's default for the GPU
    max_seqs: int = 0  # max_num_seqs; 0: vLLM's default for the GPU

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise BenchError("--tp must be at least 1")
        if self.arch.heads % self.tp:
            raise BenchError(
                f"{self.arch.name}: {self.arch.heads} heads do not split over {self.tp}"
            )
        dtype_bytes(self.weights)
        dtype_bytes(self.kv)
        budget, seqs = vllm_server_defaults(self.hardware)
        if self.token_budget <= 0:
            object.__setattr__(self, "token_budget", budget)
        if self.max_seqs <= 0:
            object.__setattr__(self, "max_seqs", seqs)

    @property
    def weight_bytes(self) -> float:
        return self.arch.total_params * dtype_bytes(self.weights)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.arch.kv_bytes_per_token(dtype_bytes(self.kv))

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache the replica holds: what vLLM's memory share leaves after the
        weights and an activation reserve, over the KV bytes of one token."""
        free = (
            self.tp * (self.hardware.mem_bytes * self.gpu_memory_utilization - ACTIVATION_RESERVE)
            - self.weight_bytes
        )
        return max(0, int(free / self.kv_bytes_per_token))

    def describe(self) -> str:
        return (
            f"{self.tp} x {self.hardware.name} ({self.hardware.source}), {self.arch.name} "
            f"weights {self.weights} ({self.weight_bytes / 1e9:.1f} GB), KV {self.kv} "
            f"({self.kv_bytes_per_token / 1024:.0f} KiB a token, {self.kv_capacity_tokens():,} "
            f"tokens at {self.gpu_memory_utilization:.0%} memory)"
        )


@dataclass(frozen=True)
class Batch:
    """What one iteration runs."""

    decode_seqs: float  # sequences decoding one token each
    decode_context: float  # tokens those sequences attend to, summed
    prefill_tokens: float = 0.0  # uncached prompt tokens computed this iteration
    prefill_context: float = 0.0  # sum over those tokens of the positions they attend to
    prefill_seqs: float = 0.0  # sequences whose prefill chunk runs (their KV is read once)
    prefill_kv_read: float = 0.0  # cached-prefix tokens those chunks read


@dataclass(frozen=True)
class StepTerms:
    compute_s: float  # linear + attention FLOPs at the efficient peak
    memory_s: float  # weights + KV bytes at the efficient bandwidth
    comm_s: float
    overhead_s: float
    total_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory bandwidth"


def touched_experts(arch: Architecture, tokens: float) -> float:
    """Expected distinct experts a layer reads for ``tokens`` tokens routed independently."""
    if not arch.is_moe or tokens <= 0:
        return 0.0
    k, e = arch.experts_per_token, arch.experts
    return e * (1.0 - (1.0 - k / e) ** tokens)


def step_terms(spec: ReplicaSpec, c: Coefficients, b: Batch) -> StepTerms:
    arch, hw, tp = spec.arch, spec.hardware, spec.tp
    wb = dtype_bytes(spec.weights)
    peak, runs_as = hw.peak(spec.weights)
    attn_peak, _ = hw.peak("bf16")
    if runs_as == "fp8":
        peak = attn_peak * c.fp8_speedup
    tokens = b.decode_seqs + b.prefill_tokens
    samples = b.decode_seqs + b.prefill_seqs
    lin_flops = 2 * arch.layer_params(active=True) * tokens + 2 * arch.lm_head_params * samples
    dense_weights = arch.layer_params() - arch.moe_layers * arch.experts * arch.expert_params
    moe_weights = arch.moe_layers * touched_experts(arch, tokens) * arch.expert_params
    w_bytes = (dense_weights + moe_weights + arch.lm_head_params) * wb
    attn_flops = (
        4 * arch.layers * arch.heads * arch.head_dim * (b.decode_context + b.prefill_context)
    )
    kv_bytes = spec.kv_bytes_per_token * (b.decode_context + b.prefill_kv_read + b.prefill_tokens)
    fl, bw = c.compute_eff, c.bandwidth_eff
    lin_c, lin_m = lin_flops / tp / (peak * fl), w_bytes / tp / (hw.mem_bw * bw)
    att_c, att_m = attn_flops / tp / (attn_peak * fl), kv_bytes / tp / (hw.mem_bw * bw)
    comm = 0.0
    if tp > 1:
        msg = tokens * arch.hidden * 2.0
        comm = 2 * arch.layers * (2 * (tp - 1) / tp * msg / hw.link_bw + ALLREDUCE_LATENCY_S)
    total = lin_c + lin_m + max(att_c, att_m) + comm + c.step_s
    return StepTerms(lin_c + att_c, lin_m + att_m, comm, c.step_s, total)


def step_s(spec: ReplicaSpec, c: Coefficients, b: Batch) -> float:
    return step_terms(spec, c, b).total_s


def linearised(
    spec: ReplicaSpec, c: Coefficients, batch: int, context: int
) -> tuple[float, float, float]:
    """(iter_s, decode_seq_s, prefill_token_s) of the CPU form around ``batch`` sequences of
    ``context`` tokens: the same three costs `loopstack.bench.load.simulate.EngineModel` fits."""
    base = step_s(spec, c, Batch(batch, batch * context))
    per_seq = step_s(spec, c, Batch(batch + 1, (batch + 1) * context)) - base
    per_tok = (step_s(spec, c, Batch(batch, batch * context, 1024, 1024 * 512, 1)) - base) / 1024
    return base - per_seq * batch, per_seq, per_tok


# ---------------------------------------------------------------------------
# the fit: three published figures, none of them in the validation set


def fit_coefficients() -> Coefficients:
    from loopstack.bench.load.architecture import load_architecture
    from loopstack.bench.load.hardware import get_hardware

    llama = load_architecture("meta-llama/Llama-3.1-8B-Instruct")
    h100 = ReplicaSpec(get_hardware("h100"), llama)
    # compute: BLIS's beta1 is the cost of one more prefill token on an H100 (its fit also
    # carries a fixed beta0 a step, so beta1 is the marginal, compute-bound cost)
    one = Coefficients(1.0, 1.0)
    ctx = 512  # a mid-length prompt's average attention span
    big = Batch(0, 0, 4096, 4096 * ctx, 1)
    ideal = step_terms(h100, one, big).compute_s / 4096
    compute_eff = min(1.0, ideal / BLIS_H100_LLAMA8B_BETA1_S)
    # bandwidth: one request decoding on an A100 40GB reads the weights and its KV each token
    a100 = ReplicaSpec(get_hardware("a100-40gb"), llama)
    dec = Batch(1, A100_40GB_LLAMA8B_CONTEXT)
    ideal_dec = step_terms(a100, replace(one, compute_eff=compute_eff), dec).memory_s
    bandwidth_eff = min(1.0, ideal_dec * A100_40GB_LLAMA8B_DECODE_TOK_S)
    return Coefficients(
        compute_eff=round(compute_eff, 3),
        bandwidth_eff=round(bandwidth_eff, 3),
        step_s=0.0,  # one decode figure cannot split a fixed step cost from bandwidth: 0
        request_s=BLIS_H100_LLAMA8B_ALPHA0_S,
        request_token_s=BLIS_H100_LLAMA8B_ALPHA1_S,
        fp8_speedup=round(FP8_SPEEDUP, 3),
        fitted_on=(
            "BLIS's fitted prefill cost a token (beta1) and request overheads (alpha0, alpha1) "
            "for Llama-3.1-8B on an H100 (inference-sim defaults.yaml), and a published "
            "Llama-3.1-8B decode at one request on an A100 40GB (75 tok/s, johnmusgrave.com); "
            "FP8 over bf16 from BLIS's prefill costs of phi-4 and Qwen2.5-7B both ways"
        ),
    )
