"""`bench plan --fit ... --holdout ...`: fit the replica model on a saved sweep, check it on
the levels it did not see, and plan with it under the inputs the user gives (tool latency,
context growth, hit rate), optionally against a run on several replicas.

It fills ``RunResult.validation`` and ``RunResult.capacity`` so the JSON and HTML reports
carry the measured error next to the plan, and returns the lines the command prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from loopstack.bench.common import percentile
from loopstack.bench.load import BenchError
from loopstack.bench.load.capacity import capacity_plan, token_hit_rate
from loopstack.bench.load.holdout import (
    HoldoutRow,
    MixtureSampler,
    Validation,
    WorkloadFor,
    observed,
    shapes_by_step,
    tool_words,
    workload_factory,
)
from loopstack.bench.load.result import RunResult, load_result
from loopstack.bench.load.scenario import Sampler, ToolLatency, parse_distribution
from loopstack.bench.load.simulate import Fit, StepShape, Workload, fit_engine, simulate_many


@dataclass
class ModelPlanOptions:
    fit: list[int] | None  # None: every level not held out
    holdout: list[int]
    agents: int
    slo_p95_step_s: float
    slo_p95_task_s: float | None = None
    tool_latency: str | None = None
    context_growth: int | None = None
    hit_rate: float | None = None
    replica_checks: list[tuple[int, int]] = field(default_factory=list)
    arm: str = "ours"


def regrow(shapes: list[list[StepShape]], tokens: int) -> list[list[StepShape]]:
    """Step j's prompt = the first step's + j x ``tokens``, its cached share kept."""
    out = []
    for j, step in enumerate(shapes):
        row = []
        for k, s in enumerate(step):
            base = shapes[0][k % len(shapes[0])].prompt
            prompt = base + j * tokens
            share = s.cached / s.prompt if s.prompt else 0.0
            row.append(StepShape(prompt, round(prompt * share), s.completion))
        out.append(row)
    return out


@dataclass
class Measured:
    """One level of a run on several replicas: pooled over one file per replica, or one
    file against all of them behind a router."""

    agents: int
    steps_per_s: float | None
    p50_s: float | None
    p95_s: float | None


def pooled(paths: list[Path], arm: str = "ours") -> list[Measured]:
    """Levels by position: agents and steps/s add up, warm latencies are pooled."""
    runs = []
    for p in paths:
        try:
            runs.append(load_result(p))
        except Exception as exc:
            raise BenchError(f"cannot read {p}: {exc}") from exc
    by_run = [
        sorted((lv for lv in r.levels if lv.summary.arm == arm), key=lambda lv: lv.summary.level)
        for r in runs
    ]
    out = []
    for group in zip(*by_run, strict=False):
        lat = [
            x.latency_s for lv in group for x in lv.steps if x.ok and not x.cold and not x.warmup
        ]
        rates = [lv.summary.steps_per_s for lv in group]
        out.append(
            Measured(
                agents=sum(int(lv.summary.level) for lv in group),
                steps_per_s=sum(r for r in rates if r) if all(rates) else None,
                p50_s=percentile(lat, 50) if lat else None,
                p95_s=percentile(lat, 95) if lat else None,
            )
        )
    return out


def validate(
    result: RunResult,
    fit: Sequence[int],
    holdout: Sequence[int],
    arm: str = "ours",
    reps: int = 8,
    tool: Sampler | None = None,
) -> tuple[Validation, Fit, WorkloadFor]:
    """Fit on ``fit`` levels of a saved sweep; predict ``holdout`` (and the fit levels)."""
    levels = {int(lv.summary.level): lv for lv in result.levels if lv.summary.arm == arm}
    missing = [n for n in [*fit, *holdout] if n not in levels]
    if missing:
        raise BenchError(f"levels {missing} are not in the result (it has {sorted(levels)})")
    if not fit:
        raise BenchError("the fit needs at least one level")
    fit_steps = [s for n in fit for s in levels[n].steps]
    shapes = shapes_by_step(fit_steps)
    if not shapes:
        raise BenchError("the fit levels have no successful steps with token counts")
    if tool is None:
        tool = MixtureSampler(
            ToolLatency.model_validate(result.scenario.get("tool_latency") or {}),
            result.scenario.get("tools") or [],
        )
    tasks = int(result.config.get("tasks_per_agent", 1))
    make = workload_factory(shapes, tool, tasks)
    obs = [observed(n, levels[n].steps, levels[n].summary) for n in sorted(fit)]
    fitted = fit_engine(obs, make)
    m = fitted.model
    rows = []
    for n in sorted({*fit, *holdout}):
        sim = simulate_many(m, make(n), reps)
        s = levels[n].summary
        rows.append(
            HoldoutRow(
                agents=n,
                role="fit" if n in fit else "holdout",
                measured_p50_s=s.step_latency.p50,
                measured_p95_s=s.step_latency.p95,
                measured_steps_per_s=s.steps_per_s,
                predicted_p50_s=sim.p(50),
                predicted_p95_s=sim.p(95),
                predicted_steps_per_s=sim.steps_per_s,
                predicted_task_p95_s=sim.task_p(95),
                measured_task_p95_s=s.task_latency.p95,
                warm_steps=s.warm_steps,
            )
        )
    assumptions = [
        "one replica = one vLLM engine; each scheduler iteration costs a fixed part, a part "
        "per decoding sequence and a part per uncached prompt token (chunked prefill, "
        f"budget {m.token_budget} tokens); fitted: {m.describe()}",
        "one iteration (decode time per token) and the prefill time from vLLM's request "
        f"histograms at {min(fit)} agent(s); fitted on {sorted(fit)}: the per-sequence share "
        f"of an iteration ({fitted.split:.2f}) and the per-token share of that prefill time "
        f"({fitted.prefill_share:.2f}; the rest is per-request latency outside the worker)",
        "each step's prompt, cached and completion tokens drawn from the fit levels' steps "
        f"of the same index ({sum(len(s) for s in shapes)} steps, {len(shapes)} step indices):"
        " context growth and the prefix-cache hit rate as measured",
        f"tool latency: {tool_words(result.scenario)}, the tool drawn uniformly",
        f"closed loop: {tasks} task(s) per agent, the next step sent when the tool returns",
        "warm steps only in the measured latencies (a new tool schema's first use is not modelled)",
    ]
    val = Validation(
        fit_levels=sorted(fit),
        holdout_levels=sorted(holdout),
        engine=m.describe(),
        split=fitted.split,
        fit_error=fitted.error,
        rows=rows,
        assumptions=assumptions,
        iter_s=m.iter_s,
        decode_seq_s=m.decode_seq_s,
        prefill_token_s=m.prefill_token_s,
        overhead_s=m.overhead_s,
    )
    return val, fitted, make


def model_plan(
    result: RunResult,
    opts: ModelPlanOptions,
    measured_replicas: list[Path] | None = None,
    replicas: int = 2,
) -> list[str]:
    levels = sorted({int(s.level) for s in result.summaries(opts.arm)})
    fit = opts.fit or [n for n in levels if n not in opts.holdout]
    val, fitted, make = validate(result, fit, opts.holdout, opts.arm)
    result.validation = val
    shapes = make(1).shapes
    measured_hit = token_hit_rate(shapes)
    inputs = [f"replica model: {fitted.model.describe()}"]
    tool = make(1).tool
    if opts.tool_latency:
        dist = parse_distribution(opts.tool_latency)
        tool = MixtureSampler(ToolLatency(default=dist), [])
        inputs.append(f"tool latency {opts.tool_latency} (mean {tool.mean():.2f} s)")
    else:
        inputs.append(f"tool latency as in the run's scenario (mean {tool.mean():.2f} s)")
    if opts.context_growth is not None:
        shapes = regrow(shapes, opts.context_growth)
        inputs.append(f"context growth {opts.context_growth} prompt tokens per step")
    else:
        growth = [sum(s.prompt for s in st) / len(st) for st in shapes]
        inputs.append(
            "context growth as measured: mean prompt tokens by step "
            + " -> ".join(f"{g:.0f}" for g in growth)
        )
    hit = opts.hit_rate if opts.hit_rate is not None else measured_hit
    inputs.append(
        f"prefix-cache hit rate {hit:.0%} ({'given' if opts.hit_rate is not None else 'measured'}"
        ", tokens served from cache / prompt tokens)"
        if hit is not None
        else "prefix-cache hit rate: not reported by the endpoint"
    )
    base = workload_factory(shapes, tool, make(1).tasks_per_agent)

    def make_plan_wl(n: int) -> Workload:
        wl = base(n)
        return replace(wl, hit_rate=opts.hit_rate) if opts.hit_rate is not None else wl

    checks = list(opts.replica_checks)
    measured = pooled(measured_replicas, opts.arm) if measured_replicas else []
    checks += [(replicas, m.agents) for m in measured]
    cap = capacity_plan(
        fitted.model,
        make_plan_wl,
        opts.agents,
        opts.slo_p95_step_s,
        opts.slo_p95_task_s,
        hit,
        inputs,
        replica_checks=checks,
    )
    by_agents = {m.agents: m for m in measured}
    for rp in cap.replica_predictions:
        got = by_agents.get(rp.agents)
        if rp.replicas == replicas and got is not None:
            rp.measured_steps_per_s = got.steps_per_s
            rp.measured_p50_step_s = got.p50_s
            rp.measured_p95_step_s = got.p95_s
    result.capacity = cap
    return [*val.lines(), *cap.lines()]
