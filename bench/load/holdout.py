"""The plan checked against measurement: fit the replica model on some levels of a sweep,
predict the levels it did not see, and say how far off it was.

``validate(result, fit=[1, 4, 16], holdout=[8, 12])`` fits ``bench.load.simulate`` on the
fit levels of a saved sweep and predicts each held-out level's p50 and p95 warm step
latency and steps/s; the error is ``predicted / measured - 1``. The same fitted model then
answers the plan's questions (`bench.load.capacity`). Everything the model assumes is
written into the result (``Validation.assumptions``) so the report can name it.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.load.metrics import StepRecord
from bench.load.scenario import Sampler, ToolLatency
from bench.load.simulate import (
    Fit,
    Observed,
    StepShape,
    Workload,
    fit_engine,
    simulate_many,
)


class MixtureSampler(Sampler):
    """A tool latency: the tool drawn uniformly from the scenario's, then its distribution."""

    def __init__(self, latency: ToolLatency, tools: Sequence[str]) -> None:
        self.default = latency.default.sampler()
        self.per_tool = {k: d.sampler() for k, d in latency.per_tool.items()}
        self.tools = list(tools) or [""]

    def _for(self, tool: str) -> Sampler:
        return self.per_tool.get(tool, self.default)

    def sample(self, rng: random.Random, tool: str = "") -> float:
        return self._for(tool or rng.choice(self.tools)).sample(rng, tool)

    def mean(self) -> float:
        return sum(self._for(t).mean() for t in self.tools) / len(self.tools)


@dataclass
class HoldoutRow:
    agents: int
    role: str  # fit | holdout
    measured_p50_s: float | None
    measured_p95_s: float | None
    measured_steps_per_s: float | None
    predicted_p50_s: float | None
    predicted_p95_s: float | None
    predicted_steps_per_s: float | None
    predicted_task_p95_s: float | None = None
    measured_task_p95_s: float | None = None
    warm_steps: int = 0

    def error(self, what: str) -> float | None:
        got = getattr(self, f"predicted_{what}")
        want = getattr(self, f"measured_{what}")
        return got / want - 1.0 if got is not None and want else None


@dataclass
class Validation:
    fit_levels: list[int]
    holdout_levels: list[int]
    engine: str  # the fitted model, in words
    split: float
    fit_error: float
    rows: list[HoldoutRow] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    iter_s: float = 0.0
    decode_seq_s: float = 0.0
    prefill_token_s: float = 0.0
    overhead_s: float = 0.0

    def worst(self, what: str) -> float | None:
        held = [r.error(what) for r in self.rows if r.role == "holdout"]
        errs = [abs(e) for e in held if e is not None]
        return max(errs) if errs else None

    def lines(self) -> list[str]:
        out = [
            f"model fitted on {self.fit_levels} agents ({self.engine}; RMS fit error "
            f"{self.fit_error:.1%})"
        ]
        for r in self.rows:
            out.append(
                f"  {r.role:7s} {r.agents:3d} agents: "
                f"p50 {_pair(r.predicted_p50_s, r.measured_p50_s)}"
                f", p95 {_pair(r.predicted_p95_s, r.measured_p95_s)}"
                f", steps/s {_pair(r.predicted_steps_per_s, r.measured_steps_per_s, 3)}"
                f" ({r.warm_steps} warm steps)"
            )
        for what, label in (("p95_s", "p95 step"), ("steps_per_s", "steps/s"), ("p50_s", "p50")):
            w = self.worst(what)
            if w is not None:
                out.append(f"  worst held-out error on {label}: {w:.1%}")
        return out


def _pair(pred: float | None, meas: float | None, d: int = 2) -> str:
    if pred is None or meas is None:
        return "-"
    err = f" ({pred / meas - 1:+.0%})" if meas else ""
    return f"{pred:.{d}f} predicted / {meas:.{d}f} measured{err}"


# ---------------------------------------------------------------------------
# from a saved sweep to the model's inputs


def shapes_by_step(steps: Sequence[StepRecord]) -> list[list[StepShape]]:
    """The (prompt, cached, completion) tokens of every successful step, by step index."""
    by: dict[int, list[StepShape]] = defaultdict(list)
    for s in steps:
        if s.ok and s.prompt_tokens:
            by[s.step].append(StepShape(s.prompt_tokens, s.cached_tokens or 0, s.completion_tokens))
    return [by[k] for k in sorted(by)] if by else []


def observed(level: int, steps: Sequence[StepRecord], summary: object) -> Observed:
    from bench.load.metrics import LevelSummary

    assert isinstance(summary, LevelSummary)
    ok = [s for s in steps if s.ok]
    engine = summary.engine or {}
    return Observed(
        agents=level,
        p50_s=summary.step_latency.p50 or 0.0,
        p95_s=summary.step_latency.p95 or 0.0,
        steps_per_s=summary.steps_per_s or 0.0,
        engine_e2e_s=engine.get("e2e_s"),
        engine_prefill_s=engine.get("prefill_s"),
        engine_decode_s=engine.get("decode_s"),
        uncached_mean=(
            sum(max(0, s.prompt_tokens - (s.cached_tokens or 0)) for s in ok) / len(ok)
            if ok
            else None
        ),
        completion_mean=sum(s.completion_tokens for s in ok) / len(ok) if ok else None,
    )


WorkloadFor = Callable[[int], Workload]


def workload_factory(
    shapes: list[list[StepShape]],
    tool: Sampler,
    tasks_per_agent: int,
    think: Sampler | None = None,
    hit_rate: float | None = None,
) -> WorkloadFor:
    def make(agents: int) -> Workload:
        return Workload(agents, tasks_per_agent, shapes, tool, think, hit_rate)

    return make


def validate(
    result: object,
    fit: Sequence[int],
    holdout: Sequence[int],
    arm: str = "ours",
    reps: int = 8,
    tool: Sampler | None = None,
) -> tuple[Validation, Fit, WorkloadFor]:
    """Fit on ``fit`` levels of a saved sweep; predict ``holdout`` (and the fit levels)."""
    from bench.load import BenchError
    from bench.load.result import RunResult

    assert isinstance(result, RunResult)
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
        f"tool latency: {_tool_words(result.scenario)}, the tool drawn uniformly",
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


def _tool_words(scenario: dict[str, object]) -> str:
    lat = scenario.get("tool_latency")
    return f"the scenario's {lat}" if lat else "none"
