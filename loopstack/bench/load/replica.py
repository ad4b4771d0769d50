"""One replica in steady state under a request stream: the iteration time continuous batching
settles at, and the latencies that follow.

At ``rate`` requests a second, each with ``uncached`` prompt tokens to prefill and ``output``
tokens to decode, an iteration of ``t`` seconds carries (Little's law)

    B = rate x output x t      decoding sequences        P = rate x uncached x t   prefill tokens

and costs ``t = step(B, P, their contexts)`` (`loopstack.bench.load.roofline`, or BLIS's
coefficients; averaged over decode-only iterations and those carrying prefill chunks: `mixed_step`).
The smallest fixed point is found by Newton's method from an idle step (the iterates rise to it);
none below ``MAX_ITER_S``, a slope of 1 or more, B + P past the token budget, or B past
``max_num_seqs``: the replica is saturated at that rate. ``load`` = dt/dt' at the fixed point: the
share of an iteration that grows with the load, 1 at saturation.

Latencies (each request sees the steady iteration):

    TPOT  = t                               (one token per running sequence per iteration)
    TTFT  = request overhead + t x (1/2 + ceil(uncached / (budget - B))) + wait
    wait  = t x load / (1 - load) x ln(1 / (1 - q))      at quantile q (M/M/1-like tail)
    e2e   = TTFT + (output - 1) x TPOT
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from loopstack.bench.load.roofline import Batch

MAX_ITER_S = 30.0

StepFn = Callable[[Batch], float]
OverheadFn = Callable[[float], float]  # prompt tokens -> per-request seconds (TTFT, e2e)


@dataclass(frozen=True)
class Traffic:
    rate: float  # requests a second into this replica
    prompt: float  # mean prompt tokens (context) a request
    uncached: float  # of which prefilled (not served from the prefix cache)
    output: float  # mean output tokens


@dataclass(frozen=True)
class Steady:
    iter_s: float
    decode_seqs: float
    prefill_tokens: float  # per iteration
    load: float
    running_kv_tokens: float  # KV the running sequences hold
    batch: Batch

    def wait_s(self, q: float) -> float:
        if self.load <= 0:
            return 0.0
        return self.iter_s * self.load / max(1e-9, 1 - self.load) * math.log(1 / (1 - q))


@dataclass(frozen=True)
class Saturated:
    why: str  # "step time" | "token budget" | "max_num_seqs"


def batch_at(tr: Traffic, t: float) -> Batch:
    b = tr.rate * tr.output * t
    p = tr.rate * tr.uncached * t
    starts = tr.rate * t
    cached = max(0.0, tr.prompt - tr.uncached)
    return Batch(
        decode_seqs=b,
        decode_context=b * (tr.prompt + tr.output / 2),
        prefill_tokens=p,
        prefill_context=p * (cached + tr.uncached / 2),
        prefill_seqs=starts,
        prefill_kv_read=starts * cached,
    )


def mixed_step(step: StepFn, tr: Traffic, t: float, budget: int) -> float:
    """The mean iteration at ``t``: prefill comes in chunks, one request's in ceil(uncached /
    room) iterations, so a share ``phi`` of the iterations carries all the prefill tokens and
    the rest only decodes. Same as one average batch where the cost is linear in tokens; not
    for an MoE, whose experts read grows concavely with the tokens of one iteration."""
    b = batch_at(tr, t)
    if 0 < b.decode_seqs < 1:  # an idle engine runs no iterations: a busy one decodes >= 1
        b = replace(b, decode_seqs=1.0, decode_context=b.decode_context / b.decode_seqs)
    if b.prefill_tokens <= 0:
        return step(b)
    chunks = max(1, math.ceil(tr.uncached / max(1.0, budget - b.decode_seqs)))
    phi = min(1.0, tr.rate * t * chunks)
    if phi >= 1.0:
        return step(b)
    dec = Batch(b.decode_seqs, b.decode_context)
    pre = Batch(
        b.decode_seqs, b.decode_context, b.prefill_tokens / phi, b.prefill_context / phi,
        b.prefill_seqs / phi, b.prefill_kv_read / phi,
    )  # fmt: skip
    return (1 - phi) * step(dec) + phi * step(pre)


def solve(step: StepFn, tr: Traffic, budget: int, max_seqs: int) -> Steady | Saturated:
    # Newton on g(t) = step(batch(t)) - t from the idle step, safeguarded by bisection
    # (an MoE's expert reads grow concavely with the batch: Newton can step past the root)
    t = step(Batch(0.0, 0.0))
    lo, hi = 0.0, math.inf  # g > 0 at lo, g < 0 at hi
    for _ in range(200):
        ft = mixed_step(step, tr, t, budget)
        g = ft - t
        if abs(g) <= 1e-7 * t:
            break
        if g > 0:
            lo = t
        else:
            hi = t
        dt = t * 1e-4
        slope = (mixed_step(step, tr, t + dt, budget) - ft) / dt
        nxt = t + g / (1.0 - slope) if slope < 1.0 else math.inf
        if not lo < nxt < hi:  # past a known bracket, or no root in sight yet: widen
            nxt = 2 * t if math.isinf(hi) else (lo + hi) / 2
        t = nxt
        if t > MAX_ITER_S:
            return Saturated("step time")
    else:
        return Saturated("step time")
    b = batch_at(tr, t)
    if b.decode_seqs > max_seqs:
        return Saturated("max_num_seqs")
    if b.decode_seqs + b.prefill_tokens > budget:
        return Saturated("token budget")
    dt = t * 1e-3
    load = min(0.999, max(0.0, (mixed_step(step, tr, t + dt, budget) - t) / dt))
    return Steady(
        iter_s=t,
        decode_seqs=b.decode_seqs,
        prefill_tokens=b.prefill_tokens,
        load=load,
        running_kv_tokens=b.decode_seqs * (tr.prompt + tr.output / 2),
        batch=b,
    )


@dataclass(frozen=True)
class Latency:
    ttft_s: float
    tpot_s: float
    e2e_s: float


def latency(
    st: Steady, tr: Traffic, overhead: OverheadFn, budget: int, q: float = 0.5,
    uncached: float | None = None, output: float | None = None, prompt: float | None = None,
) -> Latency:  # fmt: skip
    """One request's TTFT, TPOT and end-to-end at quantile ``q`` of the queueing wait (its
    own prompt and output may differ from the mean's: a p95 step's longer context)."""
    u = tr.uncached if uncached is None else uncached
    o = tr.output if output is None else output
    p = tr.prompt if prompt is None else prompt
    room = max(1.0, budget - st.decode_seqs)
    chunks = max(1, math.ceil(u / room))
    ttft = overhead(p) + st.iter_s * (0.5 + chunks) + st.wait_s(q)
    return Latency(ttft, st.iter_s, ttft + max(0.0, o - 1) * st.iter_s)


def max_rate(feasible: Callable[[float], bool], hi: float = 1.0, tol: float = 0.002) -> float:
    """The largest rate ``feasible`` accepts (monotone: feasible below, not above)."""
    lo = 0.0
    while feasible(hi):
        lo, hi = hi, hi * 2
        if hi > 1e7:
            return lo
    while hi - lo > tol * max(hi, 1e-9):
        mid = (lo + hi) / 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo
