"""An iteration-level model of one vLLM replica under closed-loop agents, and its fit.

The plan needs step latency and step rate at agent counts nobody measured, and for tool
pauses, context sizes and prefix-cache hit rates other than the sweep's. Like Vidur and
llm-d's BLIS it simulates the engine one scheduler iteration at a time, here with three
costs measured on the sweep itself:

    iteration seconds = iter_s + decode_seq_s x (sequences decoding)
                               + prefill_token_s x (prompt tokens prefilled this iteration)

vLLM's scheduler (chunked prefill) gives every running sequence one decode token per
iteration and fills the rest of its token budget with prompt tokens, first come first
served; a prompt's cached prefix costs nothing. Outside the worker each step pays
``overhead_s``, latency that does not grow with load (our layer, HTTP, the client, and the
engine's per-request set-up on the other core). Agents are closed loops: send, wait for
the reply, pause for the tool (a sampled latency), send the next step with a longer context.

Each simulated step draws its (prompt, cached, completion) tokens from the sweep's records
of the same step index, so context growth and the spread of answer lengths come from
measurement; a what-if hit rate rescales the uncached part. ``fit_engine`` starts from
vLLM's request histograms at the lowest fit level (decode time per token = one iteration;
prefill time; end-to-end time against the client's) and fits two shares on the fit levels
(least squares on p50 and p95 step latency and step rate): how much of an iteration is
per decoding sequence, and how much of the one-agent prefill time is per prompt token
(the rest is per-request latency, added to ``overhead_s``). Pure and seeded: the same
inputs give the same figures.

The form was chosen on one sweep (2026-12-03, ``sweep1``, where a per-request *serial*
cost and a one-parameter fit each predicted the held-out levels 18-40 % off) and then
frozen before the sweep it is judged on; docs/results/capacity-2026-12-03 keeps both.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from loopstack.bench.common import percentile
from loopstack.bench.load.scenario import Sampler

#: vLLM's default token budget of one scheduler iteration on CPU (max_num_batched_tokens).
DEFAULT_TOKEN_BUDGET = 2048


@dataclass(frozen=True)
class EngineModel:
    """What one replica costs; see the module docstring."""

    iter_s: float
    decode_seq_s: float
    prefill_token_s: float
    overhead_s: float = 0.0
    token_budget: int = DEFAULT_TOKEN_BUDGET

    def describe(self) -> str:
        return (
            f"iteration = {self.iter_s * 1000:.1f} ms + {self.decode_seq_s * 1000:.1f} ms per "
            f"decoding sequence + {self.prefill_token_s * 1000:.2f} ms per uncached prompt "
            f"token (budget {self.token_budget}); {self.overhead_s * 1000:.0f} ms per step "
            "outside the engine's worker"
        )


@dataclass(frozen=True)
class StepShape:
    """One step's tokens: prompt, of which cached, and completion."""

    prompt: int
    cached: int
    completion: int


@dataclass
class Workload:
    """Closed-loop agents: each runs ``tasks_per_agent`` tasks of ``len(shapes)`` steps."""

    agents: int
    tasks_per_agent: int
    shapes: list[list[StepShape]]  # per step index, the measured shapes to draw from
    tool: Sampler
    think: Sampler | None = None
    hit_rate: float | None = None  # what-if: share of prompt tokens served from cache
    miss_scale: float = 1.0  # what-if: the measured uncached tokens times this

    @property
    def steps_per_task(self) -> int:
        return len(self.shapes)


@dataclass
class SimResult:
    agents: int
    latencies: list[float] = field(default_factory=list)
    task_latencies: list[float] = field(default_factory=list)
    window_s: float = 0.0
    steps: int = 0

    @property
    def steps_per_s(self) -> float | None:
        return self.steps / self.window_s if self.window_s > 0 else None

    def p(self, q: float) -> float | None:
        return percentile(self.latencies, q) if self.latencies else None

    def task_p(self, q: float) -> float | None:
        return percentile(self.task_latencies, q) if self.task_latencies else None


@dataclass
class _Agent:
    task: int = 0
    step: int = 0
    task_start: float = 0.0


@dataclass
class _Req:
    agent: int
    send: float
    prefill_left: int
    decode_left: int


def _uncached(shape: StepShape, hit_rate: float | None, miss_scale: float = 1.0) -> int:
    if hit_rate is None:
        return max(0, round((shape.prompt - shape.cached) * miss_scale))
    return max(1, round(shape.prompt * (1.0 - hit_rate) * miss_scale))


def simulate(model: EngineModel, wl: Workload, seed: int = 0) -> SimResult:
    """One closed-loop level on one replica; figures defined as the load test defines them
    (step latency send -> last byte; steps/s over the first start -> last end window)."""
    rng = random.Random(seed)
    res = SimResult(wl.agents)
    agents = [_Agent() for _ in range(wl.agents)]
    # (arrival at the engine = send + overhead, agent, send)
    arrivals = [(model.overhead_s, a, 0.0) for a in range(wl.agents)]
    heapq.heapify(arrivals)
    active: list[_Req] = []
    t, first, last = 0.0, math.inf, 0.0

    while arrivals or active:
        if not active:
            t = max(t, arrivals[0][0])
        while arrivals and arrivals[0][0] <= t + 1e-12:
            _, a, send = heapq.heappop(arrivals)
            ag = agents[a]
            shape = rng.choice(wl.shapes[ag.step])
            if ag.step == 0:
                ag.task_start = send
            unc = _uncached(shape, wl.hit_rate, wl.miss_scale)
            active.append(_Req(a, send, unc, max(1, shape.completion)))
        decoding = [r for r in active if r.prefill_left == 0]
        budget = max(0, model.token_budget - len(decoding))
        prefill = 0
        finishing_prefill: list[_Req] = []
        for r in active:
            if r.prefill_left == 0 or budget == 0:
                continue
            take = min(r.prefill_left, budget)
            r.prefill_left -= take
            budget -= take
            prefill += take
            if r.prefill_left == 0:
                finishing_prefill.append(r)
        t += model.iter_s + model.decode_seq_s * len(decoding) + model.prefill_token_s * prefill
        for r in decoding + finishing_prefill:
            r.decode_left -= 1
        running: list[_Req] = []
        for r in active:
            if r.decode_left > 0 or r.prefill_left > 0:
                running.append(r)
                continue
            res.latencies.append(t - r.send)
            res.steps += 1
            first, last = min(first, r.send), max(last, t)
            ag = agents[r.agent]
            ag.step += 1
            # every step's call runs its tool, the task's last too (as the load test does)
            pause = wl.tool.sample(rng)
            if wl.think is not None:
                pause += wl.think.sample(rng)
            if ag.step >= wl.steps_per_task:
                res.task_latencies.append(t + pause - ag.task_start)
                ag.task += 1
                ag.step = 0
                if ag.task >= wl.tasks_per_agent:
                    continue
            heapq.heappush(arrivals, (t + pause + model.overhead_s, r.agent, t + pause))
        active = running
    res.window_s = last - first if res.steps else 0.0
    return res


def simulate_many(model: EngineModel, wl: Workload, reps: int = 4, seed: int = 0) -> SimResult:
    """``reps`` seeded runs pooled (latencies joined, steps/s over the summed windows)."""
    out = SimResult(wl.agents)
    for k in range(reps):
        one = simulate(model, wl, seed + k)
        out.latencies += one.latencies
        out.task_latencies += one.task_latencies
        out.window_s += one.window_s
        out.steps += one.steps
    return out


# ---------------------------------------------------------------------------
# the fit


@dataclass
class Observed:
    """What one measured level offers the fit (warm step latencies; engine histograms)."""

    agents: int
    p50_s: float
    p95_s: float
    steps_per_s: float
    engine_e2e_s: float | None = None
    engine_prefill_s: float | None = None
    engine_decode_s: float | None = None
    uncached_mean: float | None = None
    completion_mean: float | None = None


@dataclass
class Fit:
    model: EngineModel
    split: float  # share of a one-sequence iteration that is per-sequence cost
    error: float  # RMS relative error over the fit levels (p50 and p95 latency, steps/s)
    fit_levels: list[int]
    prefill_share: float = 1.0  # share of the one-agent prefill time that is per token


def _start(low: Observed) -> tuple[float, float, float]:
    """(overhead, prefill s/token, one-sequence iteration s) from the lowest fit level."""
    if low.engine_e2e_s and low.engine_prefill_s and low.engine_decode_s:
        overhead = max(0.0, low.p50_s - low.engine_e2e_s)
        prefill = low.engine_prefill_s / max(1.0, low.uncached_mean or 1.0)
        iteration = low.engine_decode_s / max(1.0, (low.completion_mean or 2.0) - 1.0)
        return overhead, prefill, iteration
    # no engine histograms (not a vLLM target): all of a step is decode iterations
    iteration = low.p50_s / max(1.0, low.completion_mean or 1.0)
    return 0.0, 0.0, iteration


def fit_engine(
    observed: Sequence[Observed],
    workload_for: Callable[[int], Workload],
    reps: int = 3,
    grid: int = 11,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
) -> Fit:
    """Fit on ``observed`` (sorted by agents; the lowest gives the per-token costs).

    Two parameters, on a grid then refined: the share of a one-sequence iteration that is
    per-sequence cost (``split``), and how much of the lowest level's prefill time is
    per-token cost (``prefill_share``; the rest is per-request work the histogram counts as
    prefill at one agent, such as the first iteration and the constraint's set-up)."""
    obs = sorted(observed, key=lambda o: o.agents)
    overhead, prefill, iteration = _start(obs[0])
    base = EngineModel(iteration, 0.0, prefill, overhead, token_budget)
    memo: dict[tuple[float, float], tuple[float, EngineModel]] = {}

    def err(split: float, share: float) -> tuple[float, EngineModel]:
        key = (round(split, 6), round(share, 6))
        if key in memo:
            return memo[key]
        m = replace(
            base,
            iter_s=iteration * (1 - split),
            decode_seq_s=iteration * split,
            prefill_token_s=prefill * share,
            overhead_s=overhead + prefill * (1 - share) * (obs[0].uncached_mean or 0.0),
        )
        total, n = 0.0, 0
        for o in obs:
            sim = simulate_many(m, workload_for(o.agents), reps)
            pairs = ((sim.p(50), o.p50_s), (sim.p(95), o.p95_s), (sim.steps_per_s, o.steps_per_s))
            for got, want in pairs:
                if got and want:
                    total += ((got - want) / want) ** 2
                    n += 1
        memo[key] = ((math.sqrt(total / n) if n else math.inf), m)
        return memo[key]

    axis = [i / (grid - 1) for i in range(grid)]
    shares = [0.1 + 0.9 * i / (grid - 1) for i in range(grid)] if prefill > 0 else [1.0]
    split, share = min(((a, b) for a in axis for b in shares), key=lambda ab: err(*ab)[0])
    step_a, step_b = 1 / (grid - 1), 0.9 / (grid - 1)
    for _ in range(4):  # refine around the best grid point
        step_a, step_b = step_a / 2, step_b / 2
        cands = [
            (min(1.0, max(0.0, split + da)), min(1.0, max(0.05, share + db)))
            for da in (-step_a, 0.0, step_a)
            for db in ((-step_b, 0.0, step_b) if prefill > 0 else (0.0,))
        ]
        split, share = min(cands, key=lambda ab: err(*ab)[0])
    e, m = err(split, share)
    return Fit(m, split, e, [o.agents for o in obs], share)
