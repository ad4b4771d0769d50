"""KV capacity and the prefix cache under N closed-loop agents on one replica: how many
sequences it holds, and which paused agents find their context still cached.

vLLM frees a finished call's KV blocks to the tail of a free queue, keeping their contents
(the prefix cache); a new allocation takes the block at the head, evicting what it held; a
call whose prompt extends a cached prefix takes those blocks back. A paused agent's context
therefore survives ``tau`` seconds, the time the allocations take to cycle through the free
blocks (Che's characteristic time, here with first-in first-out eviction):

    free   = KV capacity - KV of the running sequences - the shared prefix (always hot)
    inflow = steps/s x (uncached prompt tokens + output tokens)    new KV a second
    tau    = free / inflow
    hit    = P(tool pause + think < tau)     a resumed step finds its context cached

A hit step prefills only the tool result; a miss prefills its whole context again (less the
shared prefix): more inflow, a shorter ``tau``, fewer hits - the cliff past which every step
re-prefills. ``hit`` is the largest fixed point, iterated from 1 jointly with the closed
loop's rate (steps/s = N / (mean step latency + mean pause)) and the replica's steady state
(`loopstack.bench.load.replica`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loopstack.bench.load.replica import (
    OverheadFn,
    Saturated,
    Steady,
    StepFn,
    Traffic,
    latency,
    solve,
)
from loopstack.bench.load.workload import AgentWorkload, PauseDist


@dataclass(frozen=True)
class AgentState:
    """N agents on one replica, modelled."""

    agents: int
    hit: float  # share of resumed steps (step 2 on) whose context is still cached
    token_hit_rate: float  # prompt tokens served from cache / prompt tokens
    steps_per_s: float
    tau_s: float  # how long a paused context survives
    kv_free_tokens: float
    steady: Steady | None
    saturated: str | None  # why no steady state: step time, token budget, KV capacity, ...
    p50_step_s: float = math.inf
    p95_step_s: float = math.inf
    ttft_p50_s: float = math.inf
    tpot_s: float = math.inf

    @property
    def feasible(self) -> bool:
        return self.steady is not None and self.saturated is None

    def tasks_per_s(self, steps: int) -> float:
        return self.steps_per_s / steps


def uncached_mean(wl: AgentWorkload, hit: float) -> float:
    """Mean prefilled tokens a call: the first call of a task its first prompt; a resumed
    call the tool result on a hit, its whole context less the shared prefix on a miss."""
    first = float(wl.first_prompt_tokens)
    rest = [
        hit * wl.tool_result_tokens + (1 - hit) * (wl.context(j) - wl.shared_prefix_tokens)
        for j in range(1, wl.steps)
    ]
    return (first + sum(rest)) / wl.steps


def agent_state(
    wl: AgentWorkload,
    agents: int,
    step: StepFn,
    overhead: OverheadFn,
    kv_capacity: int,
    budget: int,
    max_seqs: int,
    pause: PauseDist | None = None,
    rounds: int = 60,
) -> AgentState:
    pause = pause or wl.pause()
    pmean = pause.mean()
    prompt = wl.mean_context()
    hit, rate, tau, free = 1.0, 0.0, math.inf, float(kv_capacity)
    st: Steady | Saturated = Saturated("step time")
    for _ in range(rounds):
        unc = uncached_mean(wl, hit)
        # closed loop: rate = N / (step latency + pause), step latency at that rate; a
        # safeguarded fixed point (a saturated rate is too high)
        lo, hi = 0.0, agents / max(pmean, 1e-3)
        rate = rate if 0 < rate < hi else hi / 2
        for _ in range(80):
            tr = Traffic(rate, prompt, unc, wl.output_tokens)
            st = solve(step, tr, budget, max_seqs)
            if isinstance(st, Saturated):
                hi = rate
                rate = (lo + hi) / 2
                if hi - lo <= 1e-6 * hi:
                    break
                continue
            lat_s = latency(st, tr, overhead, budget).e2e_s
            new = agents / (lat_s + pmean)
            lo, hi = (rate, hi) if new > rate else (lo, rate)
            if abs(new - rate) <= 1e-5 * rate:
                rate = new
                break
            rate = new if lo < new < hi else (lo + hi) / 2
        if isinstance(st, Saturated):
            return AgentState(agents, hit, _token_hit(wl, hit), rate, tau, free, None, st.why)
        free = kv_capacity - st.running_kv_tokens - wl.shared_prefix_tokens
        if free <= 0:
            # no free KV: no paused context survives, the running ones do not fit
            return AgentState(agents, 0.0, _token_hit(wl, 0.0), rate, 0.0, free, st, "KV capacity")
        inflow = rate * (unc + wl.output_tokens)
        tau = free / inflow if inflow > 0 else math.inf
        new_hit = pause.below(tau)
        if abs(new_hit - hit) < 1e-4:
            hit = new_hit
            break
        hit = new_hit  # from 1 down: the largest fixed point
    assert isinstance(st, Steady)
    tr = Traffic(rate, prompt, uncached_mean(wl, hit), wl.output_tokens)
    last = wl.context(wl.steps - 1)
    miss_u = last - wl.shared_prefix_tokens if hit < 0.95 else float(wl.tool_result_tokens)
    p95 = latency(st, tr, overhead, budget, 0.95, miss_u, wl.out_p95(), last)
    p50 = latency(st, tr, overhead, budget, 0.5)
    return AgentState(
        agents, hit, _token_hit(wl, hit), rate, tau, free, st, None,
        p50_step_s=p50.e2e_s, p95_step_s=p95.e2e_s, ttft_p50_s=p50.ttft_s, tpot_s=st.iter_s,
    )  # fmt: skip


def _idle(step: StepFn, tr: Traffic, budget: int, max_seqs: int) -> Steady | Saturated:
    return solve(step, Traffic(1e-9, tr.prompt, tr.uncached, tr.output), budget, max_seqs)


def _token_hit(wl: AgentWorkload, hit: float) -> float:
    prompt = sum(wl.context(j) for j in range(wl.steps))
    return 1.0 - uncached_mean(wl, hit) * wl.steps / prompt


def cliff(states: list[AgentState]) -> int | None:
    """The agent count past which the cache stops holding: the last N whose resumed steps
    still hit at least half as often as the first point's."""
    if not states:
        return None
    top = states[0].hit
    prev: int | None = None
    for s in states:
        if not s.feasible:
            return None  # saturated before the cache stopped holding
        if s.hit < 0.5 * top:
            return prev
        prev = s.agents
    return None
