"""The typed result of a run, read by every output format, and the figures derived from it.

``RunResult`` is a tree of dataclasses; pydantic (``TypeAdapter``) validates it when a
saved ``result.json`` is loaded again (``bench plan``), so the file format is checked at
the edge.  NaN never appears: missing figures are ``None``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from loopstack.bench.load.capacity import CapacityPlan
from loopstack.bench.load.holdout import Validation
from loopstack.bench.load.metrics import LevelSummary, StepRecord, TaskRecord
from loopstack.bench.load.plan import Plan, PlanLevel, compute_plan, default_assumptions

JSON = dict[str, Any]


@dataclass
class LevelResult:
    summary: LevelSummary
    steps: list[StepRecord] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)
    wall_s: float = 0.0
    dropped: int = 0


@dataclass
class Comparison:
    """``num`` arm over ``den`` arm at one level, on warm steps."""

    what: str
    level: float
    num: str
    den: str
    step_p50_ratio: float | None
    ttft_p50_ratio: float | None
    steps_per_s_ratio: float | None
    output_tok_s_ratio: float | None


@dataclass
class RunResult:
    created: str
    mode: str  # closed | open
    config: JSON
    scenario: JSON
    targets: list[JSON]
    levels: list[LevelResult] = field(default_factory=list)
    batching_gain: float | None = None
    batching_levels: list[float] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    plan: Plan | None = None
    requests: JSON | None = None  # vllm bench serve figures and the cross-check
    notes: list[str] = field(default_factory=list)
    validation: Validation | None = None  # the replica model against held-out levels
    capacity: CapacityPlan | None = None  # the modelled plan (bench plan --fit ...)
    gpu_plan: list[str] = field(default_factory=list)  # bench plan --hardware: MODELLED lines

    def arms(self) -> list[str]:
        seen: list[str] = []
        for lv in self.levels:
            if lv.summary.arm not in seen:
                seen.append(lv.summary.arm)
        return seen

    def summaries(self, arm: str) -> list[LevelSummary]:
        return sorted(
            (lv.summary for lv in self.levels if lv.summary.arm == arm), key=lambda s: s.level
        )


_ADAPTER = TypeAdapter(RunResult)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def save_result(result: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(asdict(result)), indent=1))


def load_result(path: Path) -> RunResult:
    return _ADAPTER.validate_json(path.read_text())


# ---------------------------------------------------------------------------
# derived figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def batching_gain(result: RunResult, arm: str = "ours") -> tuple[float | None, list[float]]:
    """Step rate at 16 agents / at 1 (else at the highest / the lowest level)."""
    sums = [s for s in result.summaries(arm) if s.steps_per_s]
    if len(sums) < 2:
        return None, []
    by = {s.level: s for s in sums}
    lo = by.get(1) or sums[0]
    hi = by.get(16) or sums[-1]
    if hi.level <= lo.level:
        return None, []
    return _ratio(hi.steps_per_s, lo.steps_per_s), [lo.level, hi.level]


def compare_arms(result: RunResult, num: str, den: str, what: str) -> list[Comparison]:
    out = []
    dens = {s.level: s for s in result.summaries(den)}
    for a in result.summaries(num):
        b = dens.get(a.level)
        if b is None:
            continue
        out.append(
            Comparison(
                what=what,
                level=a.level,
                num=num,
                den=den,
                step_p50_ratio=_ratio(a.step_latency.p50, b.step_latency.p50),
                ttft_p50_ratio=_ratio(a.ttft.p50, b.ttft.p50),
                steps_per_s_ratio=_ratio(a.steps_per_s, b.steps_per_s),
                output_tok_s_ratio=_ratio(a.output_tok_s, b.output_tok_s),
            )
        )
    return out


def plan_levels(result: RunResult, arm: str = "ours") -> list[PlanLevel]:
    levels = []
    for lv in result.levels:
        s = lv.summary
        if s.arm != arm:
            continue
        warm = [x for x in lv.steps if not x.warmup and not x.cold]
        lat = [x.latency_s if x.ok else math.inf for x in warm]
        done = [t for t in lv.tasks if t.model_calls]
        calls = sum(t.model_calls for t in done)
        levels.append(
            PlanLevel(
                agents=s.level,
                latencies=lat,
                steps_per_s=s.steps_per_s,
                tool_s_per_step=sum(t.tool_s for t in done) / calls if calls else 0.0,
                think_s_per_step=sum(t.think_s for t in done) / calls if calls else 0.0,
                tasks_per_s=s.tasks_per_s,
            )
        )
    return levels


def make_plan(
    result: RunResult,
    agents_target: int,
    slo_p95_step_s: float,
    min_goodput: float | None = None,
    arm: str = "ours",
    replica_cost_per_hour: float | None = None,
) -> Plan:
    levels = plan_levels(result, arm)
    tool = [lv.tool_s_per_step for lv in levels]
    think = [lv.think_s_per_step for lv in levels]
    sums = result.summaries(arm)
    prompt = [s.prompt_tokens_mean for s in sums if s.prompt_tokens_mean]
    assumptions = default_assumptions(
        float(result.scenario.get("mean_steps_per_task", 0)),
        sum(tool) / len(tool) if tool else 0.0,
        sum(think) / len(think) if think else 0.0,
        sum(prompt) / len(prompt) if prompt else None,
        int(result.scenario.get("result_chars", 0)),
    )
    return compute_plan(
        levels, agents_target, slo_p95_step_s, min_goodput, assumptions, replica_cost_per_hour
    )


def summary_line(result: RunResult) -> str:
    gain = (
        f"batching gain {result.batching_gain:.2f}x "
        f"({result.batching_levels[1]:g} vs {result.batching_levels[0]:g} agents)"
        if result.batching_gain
        else "batching gain n/a (needs two levels)"
    )
    plan = result.plan.line() if result.plan else "plan: n/a"
    return f"SUMMARY {gain}; {plan}"
