"""The capacity plan: how many agents one replica holds at an SLO, and replicas for N agents.

From a closed-loop sweep (levels of concurrent agents against ONE replica):

    C*  = the highest tested agent count whose warm steps meet the SLO
          (p95 step latency <= X s; or, with a goodput target, the share of steps
          within X s >= G)
    R   = ceil(N / C*)                                   replicas for N agents

Cross-check by request rate (Little's law): at C* each agent sends one model call per
(L + T + H) seconds (L mean step latency at C*, T simulated tool time per step, H think
time per step), so N agents need N / (L + T + H) calls/s; one replica served S* calls/s
at C*:  R_rate = ceil(N / (L + T + H) / S*).  The two agree when the sweep is steady.

Cost per task: at the planned R replicas, N agents finish N x (tasks/s per agent at C*)
tasks per second, so one task occupies  replica_s = R / (N x tasks_per_s(C*) / C*)
replica-seconds (rounding R up shows as idle capacity); with a price per replica-hour P,
1,000 tasks cost  1000 x replica_s x P / 3600.

``compute_plan`` is pure; ``bench plan RESULT.json`` calls it again on the stored steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from loopstack.bench.common import percentile

FORMULA = "R = ceil(N / C*);  cross-check R_rate = ceil(N / (L + T + H) / S*)"


@dataclass
class PlanLevel:
    """What the plan needs from one level of the sweep."""

    agents: float
    latencies: list[float]  # warm step latencies, failed steps as +inf
    steps_per_s: float | None
    tool_s_per_step: float = 0.0
    think_s_per_step: float = 0.0
    tasks_per_s: float | None = None  # finished tasks per second at this level


@dataclass
class PlanPoint:
    agents: float
    p95_step_s: float | None
    goodput: float | None
    steps_per_s: float | None
    meets: bool


@dataclass
class Plan:
    agents_target: int
    slo_p95_step_s: float
    min_goodput: float | None
    per_replica: float  # C*, 0 when even the lowest level misses the SLO
    replicas: int | None  # None when no tested level meets the SLO
    replicas_by_rate: int | None
    per_agent_calls_per_s: float | None
    replica_calls_per_s: float | None
    points: list[PlanPoint] = field(default_factory=list)
    formula: str = FORMULA
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    replica_s_per_task: float | None = None  # replica-seconds one task occupies at R
    replica_cost_per_hour: float | None = None
    cost_per_1000_tasks: float | None = None

    def cost_line(self) -> str:
        if self.replica_s_per_task is None:
            return "cost: n/a (no finished tasks at C*, or no level meets the SLO)"
        line = f"cost: {self.replica_s_per_task:.1f} replica-seconds per task"
        if self.cost_per_1000_tasks is not None:
            line += (
                f"; 1,000 tasks cost {self.cost_per_1000_tasks:.2f} at "
                f"{self.replica_cost_per_hour:g} per replica-hour ({self.replicas} replicas)"
            )
        return line

    def line(self) -> str:
        crit = (
            f"goodput>={self.min_goodput:.0%} within {self.slo_p95_step_s:g} s"
            if self.min_goodput is not None
            else f"p95 step<={self.slo_p95_step_s:g} s"
        )
        if self.replicas is None:
            return f"plan: no tested level meets {crit} on one replica"
        return (
            f"plan: {self.per_replica:g} agents/replica at {crit} -> "
            f"{self.agents_target} agents need {self.replicas} replica(s)"
        )


def level_meets(lv: PlanLevel, slo_s: float, min_goodput: float | None) -> PlanPoint:
    lat = lv.latencies
    p95 = percentile(lat, 95) if lat else None
    if p95 is not None and not math.isfinite(p95):
        p95_out: float | None = math.inf
    else:
        p95_out = p95
    gp = sum(1 for x in lat if x <= slo_s) / len(lat) if lat else None
    if not lat:
        meets = False
    elif min_goodput is not None:
        meets = gp is not None and gp >= min_goodput
    else:
        meets = p95 is not None and p95 <= slo_s
    return PlanPoint(lv.agents, p95_out, gp, lv.steps_per_s, meets)


def compute_plan(
    levels: Sequence[PlanLevel],
    agents_target: int,
    slo_p95_step_s: float,
    min_goodput: float | None = None,
    assumptions: Sequence[str] = (),
    replica_cost_per_hour: float | None = None,
) -> Plan:
    levels = sorted(levels, key=lambda lv: lv.agents)
    points = [level_meets(lv, slo_p95_step_s, min_goodput) for lv in levels]
    ok = [p for p in points if p.meets]
    best = max(ok, key=lambda p: p.agents) if ok else None
    notes: list[str] = []
    plan = Plan(
        agents_target=agents_target,
        slo_p95_step_s=slo_p95_step_s,
        min_goodput=min_goodput,
        per_replica=best.agents if best else 0,
        replicas=math.ceil(agents_target / best.agents) if best else None,
        replicas_by_rate=None,
        per_agent_calls_per_s=None,
        replica_calls_per_s=None,
        points=points,
        assumptions=list(assumptions),
        notes=notes,
        replica_cost_per_hour=replica_cost_per_hour,
    )
    if best is None:
        notes.append("no tested level meets the SLO: a replica this size cannot serve it")
        return plan
    higher = [p for p in points if p.agents > best.agents]
    if not higher:
        notes.append(
            f"every tested level up to {best.agents:g} agents meets the SLO: C* is a lower "
            "bound (sweep higher to find the knee)"
        )
    elif any(p.meets is False for p in higher):
        nxt = min(p.agents for p in higher if not p.meets)
        notes.append(f"the knee lies between {best.agents:g} and {nxt:g} agents (not tested)")
    lv = next(x for x in levels if x.agents == best.agents)
    if lv.tasks_per_s and plan.replicas:
        per_agent_tasks_s = lv.tasks_per_s / best.agents
        plan.replica_s_per_task = plan.replicas / (agents_target * per_agent_tasks_s)
        if replica_cost_per_hour is not None:
            plan.cost_per_1000_tasks = 1000 * plan.replica_s_per_task * replica_cost_per_hour / 3600
    finite = [x for x in lv.latencies if math.isfinite(x)]
    if finite and lv.steps_per_s:
        cycle = sum(finite) / len(finite) + lv.tool_s_per_step + lv.think_s_per_step
        plan.per_agent_calls_per_s = 1.0 / cycle
        plan.replica_calls_per_s = lv.steps_per_s
        plan.replicas_by_rate = math.ceil(
            agents_target * plan.per_agent_calls_per_s / lv.steps_per_s - 1e-9
        )
    return plan


def default_assumptions(
    mean_steps: float,
    tool_s_per_step: float,
    think_s_per_step: float,
    prompt_tokens_mean: float | None,
    result_chars: int,
) -> list[str]:
    ctx = (
        f"~{prompt_tokens_mean:.0f} prompt tokens per call on average, "
        if (prompt_tokens_mean)
        else ""
    )
    return [
        f"the same scenario: {mean_steps:g} model calls per task, "
        f"{tool_s_per_step:.2f} s simulated tool time and {think_s_per_step:.2f} s think "
        f"time per step",
        f"context growth: {ctx}each tool result adds {result_chars} characters",
        "closed-loop agents (each waits for its reply before the next step)",
        "replicas are identical and independent; agents are spread evenly and keep "
        "affinity to one replica (its prefix cache)",
        "C* is a tested level (no interpolation): the plan rounds in the safe direction",
    ]
