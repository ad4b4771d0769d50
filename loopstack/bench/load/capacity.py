"""The modelled plan: agents per replica at an SLO on steps and on whole tasks, replicas for
N agents, and what a better prefix-cache hit rate would save.

The tested-level plan (`loopstack.bench.load.plan`) may only pick a level somebody measured; this
one asks the fitted replica model (`loopstack.bench.load.simulate`, checked on held-out levels by
`loopstack.bench.load.holdout`) at every agent count from 1 up, so it can answer for other tool
latencies, context growth and hit rates than the sweep's:

    C*  = the largest agent count whose predicted p95 step latency <= the step SLO
          (and, when given, whose predicted p95 task time <= the task SLO)
    R   = ceil(N / C*)                 (agents spread evenly, each kept on one replica)

"2x better hit rate" halves the uncached prompt tokens (the miss rate), since a hit rate
cannot double past 100 %: the plan reruns the search with that workload and reports the
replicas saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from loopstack.bench.common import fmt_num, percentile
from loopstack.bench.load.simulate import EngineModel, SimResult, StepShape, Workload, simulate_many

WorkloadFor = Callable[[int], Workload]


@dataclass
class CapacityPoint:
    agents: int
    p50_step_s: float | None
    p95_step_s: float | None
    p95_task_s: float | None
    steps_per_s: float | None
    meets: bool


@dataclass
class ReplicaPrediction:
    replicas: int
    agents: int
    per_replica: list[int]
    steps_per_s: float | None
    p50_step_s: float | None
    p95_step_s: float | None
    measured_steps_per_s: float | None = None  # a run against that many replicas, if given
    measured_p50_step_s: float | None = None
    measured_p95_step_s: float | None = None

    def error(self, what: str) -> float | None:
        got, want = getattr(self, what), getattr(self, f"measured_{what}")
        return got / want - 1.0 if got is not None and want else None


@dataclass
class CapacityPlan:
    agents_target: int
    slo_p95_step_s: float
    slo_p95_task_s: float | None
    per_replica: int  # C*, 0 when even one agent misses the SLO
    replicas: int | None
    hit_rate: float | None  # measured token hit rate of the workload
    better_hit_rate: float | None  # the what-if: half the misses
    better_per_replica: int = 0
    better_replicas: int | None = None
    points: list[CapacityPoint] = field(default_factory=list)
    replica_predictions: list[ReplicaPrediction] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        crit = f"p95 step <= {self.slo_p95_step_s:g} s"
        if self.slo_p95_task_s is not None:
            crit += f" and p95 task <= {self.slo_p95_task_s:g} s"
        if self.replicas is None:
            out = [f"modelled plan: not even one agent per replica meets {crit}"]
        else:
            out = [
                f"modelled plan: {self.per_replica} agents/replica at {crit} -> "
                f"{self.agents_target} agents need {self.replicas} replica(s)"
            ]
        if self.better_hit_rate is not None and self.hit_rate is not None:
            saved = (
                f"{self.replicas - self.better_replicas} replica(s) saved"
                if self.replicas is not None and self.better_replicas is not None
                else "n/a"
            )
            out.append(
                f"  with half the prefix-cache misses (hit rate {self.hit_rate:.0%} -> "
                f"{self.better_hit_rate:.0%}): {self.better_per_replica} agents/replica, "
                f"{self.better_replicas} replica(s): {saved}"
            )
        for r in self.replica_predictions:
            line = (
                f"  {r.replicas} replica(s), {r.agents} agents ({r.per_replica}): predicted "
                f"{fmt_num(r.steps_per_s, 3)} steps/s, step p50 {fmt_num(r.p50_step_s)} s, "
                f"p95 {fmt_num(r.p95_step_s)} s"
            )
            if r.measured_steps_per_s is not None:
                line += (
                    f"; measured {fmt_num(r.measured_steps_per_s, 3)} steps/s "
                    f"({_pct(r.error('steps_per_s'))}), p50 {fmt_num(r.measured_p50_step_s)} s "
                    f"({_pct(r.error('p50_step_s'))}), p95 {fmt_num(r.measured_p95_step_s)} s "
                    f"({_pct(r.error('p95_step_s'))})"
                )
            out.append(line)
        out += [f"  input: {i}" for i in self.inputs]
        out += [f"  note: {n}" for n in self.notes]
        return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0%} error"


def token_hit_rate(shapes: list[list[StepShape]]) -> float | None:
    flat = [s for step in shapes for s in step]
    prompt = sum(s.prompt for s in flat)
    return sum(min(s.cached, s.prompt) for s in flat) / prompt if prompt else None


def point(model: EngineModel, wl: Workload, slo_step: float, slo_task: float | None,
          reps: int) -> CapacityPoint:  # fmt: skip
    sim: SimResult = simulate_many(model, wl, reps)
    p95, task = sim.p(95), sim.task_p(95)
    meets = p95 is not None and p95 <= slo_step
    if slo_task is not None:
        meets = meets and task is not None and task <= slo_task
    return CapacityPoint(wl.agents, sim.p(50), p95, task, sim.steps_per_s, meets)


def per_replica(
    model: EngineModel,
    make: WorkloadFor,
    slo_step: float,
    slo_task: float | None,
    max_agents: int = 64,
    reps: int = 4,
) -> tuple[int, list[CapacityPoint]]:
    """C*: scan 1, 2, ... and stop after two misses in a row (latency grows with agents)."""
    points: list[CapacityPoint] = []
    best, misses = 0, 0
    for c in range(1, max_agents + 1):
        p = point(model, make(c), slo_step, slo_task, reps)
        points.append(p)
        if p.meets:
            best, misses = c, 0
        else:
            misses += 1
            if misses >= 2:
                break
    return best, points


def split_agents(agents: int, replicas: int) -> list[int]:
    base, extra = divmod(agents, replicas)
    return [base + (1 if i < extra else 0) for i in range(replicas)]


def predict_replicas(
    model: EngineModel, make: WorkloadFor, agents: int, replicas: int, reps: int = 8
) -> ReplicaPrediction:
    """R independent replicas, agents spread evenly, each agent kept on one replica."""
    split = [n for n in split_agents(agents, replicas) if n > 0]
    sims = [simulate_many(model, make(n), reps) for n in split]
    lat = [x for s in sims for x in s.latencies]
    rate = sum(s.steps_per_s or 0.0 for s in sims) or None
    return ReplicaPrediction(
        replicas,
        agents,
        split,
        rate,
        percentile(lat, 50) if lat else None,
        percentile(lat, 95) if lat else None,
    )


def capacity_plan(
    model: EngineModel,
    make: WorkloadFor,
    agents_target: int,
    slo_p95_step_s: float,
    slo_p95_task_s: float | None = None,
    hit_rate: float | None = None,
    inputs: list[str] | None = None,
    replica_checks: list[tuple[int, int]] | None = None,
    max_agents: int = 64,
    reps: int = 4,
) -> CapacityPlan:
    """The plan for ``agents_target`` agents; ``replica_checks`` = [(replicas, agents)]."""
    best, points = per_replica(model, make, slo_p95_step_s, slo_p95_task_s, max_agents, reps)
    plan = CapacityPlan(
        agents_target=agents_target,
        slo_p95_step_s=slo_p95_step_s,
        slo_p95_task_s=slo_p95_task_s,
        per_replica=best,
        replicas=math.ceil(agents_target / best) if best else None,
        hit_rate=hit_rate,
        better_hit_rate=None,
        points=points,
        inputs=list(inputs or []),
    )
    if best == max_agents:
        plan.notes.append(f"the search stopped at {max_agents} agents per replica: C* is a floor")
    if hit_rate is not None:
        plan.better_hit_rate = 1.0 - (1.0 - hit_rate) / 2

        def make_better(n: int) -> Workload:
            wl = make(n)
            return replace(wl, miss_scale=wl.miss_scale / 2)

        b, _ = per_replica(model, make_better, slo_p95_step_s, slo_p95_task_s, max_agents, reps)
        plan.better_per_replica = b
        plan.better_replicas = math.ceil(agents_target / b) if b else None
    for replicas, agents in replica_checks or []:
        plan.replica_predictions.append(predict_replicas(model, make, agents, replicas))
    return plan
