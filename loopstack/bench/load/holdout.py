"""The plan checked against measurement: what a hold-out check keeps and what the replica
model takes from a sweep.

``loopstack.bench.load.modelled.validate(result, fit=[1, 4, 16], holdout=[8, 12])`` fits
``loopstack.bench.load.simulate`` on the fit levels of a saved sweep and predicts each held-out
level's p50 and p95 warm step latency and steps/s; each ``HoldoutRow``'s error is ``predicted /
measured - 1``, and ``Validation`` (stored in the result, so the JSON and HTML reports carry it)
names every assumption. Here: those records, the tool-latency mixture and the step shapes and
observations read from the sweep's records.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loopstack.bench.load.metrics import StepRecord
from loopstack.bench.load.scenario import Sampler, ToolLatency
from loopstack.bench.load.simulate import Observed, StepShape, Workload


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
    from loopstack.bench.load.metrics import LevelSummary

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


def tool_words(scenario: dict[str, object]) -> str:
    lat = scenario.get("tool_latency")
    return f"the scenario's {lat}" if lat else "none"
