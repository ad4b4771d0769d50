"""The sweep: every level, every arm (ours, baseline, unconstrained), interleaved.

For each level the arms run one after the other, the order rotating level by level so
that drift (other work on the machine, a warming cache) does not favour one arm.  Around
each (arm, level) run the target's ``/metrics`` is scraped for the prefix-cache counters.
Every (arm, level) gets its own salt at the head of the system prompt, so no arm reuses
another's prefix cache: within a task the steps still share their prefix, as real agents
do.  The sweep stops early once the main arm saturates.  Progress is drawn with rich on
stderr; ``run_sweep`` returns the typed ``RunResult``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loopstack.bench.common import UNCONSTRAINED_EXTRA, percentile
from loopstack.bench.load.metrics import StepRecord, cache_delta, engine_delta, summarize
from loopstack.bench.load.result import (
    LevelResult,
    RunResult,
    batching_gain,
    compare_arms,
    make_plan,
)
from loopstack.bench.load.scenario import Scenario, new_nonce
from loopstack.bench.load.scheduler import LevelRunner, LoadShape, Mode, SchemaState
from loopstack.bench.load.target import OpenAITarget, TargetConfig

logger = logging.getLogger(__name__)
JSON = dict[str, Any]


@dataclass
class SweepConfig:
    levels: list[float]
    mode: Mode = "closed"
    tasks_per_agent: int = 1
    open_tasks: int = 8
    warmup_s: float = 0.0
    max_level_s: float = 600.0
    saturation_cap_s: float = 120.0
    seed: int = 0
    slo_p95_step_s: float = 10.0
    min_goodput: float | None = None
    plan_agents: int = 100
    compare_unconstrained: bool = False
    prewarm: bool = False  # one unmeasured agent runs every task once first (schemas warm)
    extra: JSON = field(default_factory=dict)

    def public(self) -> JSON:
        return {k: v for k, v in self.__dict__.items()}


def build_arms(
    main: TargetConfig, baseline: TargetConfig | None, unconstrained: bool
) -> list[TargetConfig]:
    arms = [main]
    if baseline is not None:
        arms.append(baseline)
    if unconstrained:
        arms.append(
            TargetConfig(
                name="unconstrained",
                base_url=main.base_url,
                api_key=main.api_key,
                model=main.model,
                extra_body={**main.extra_body, **UNCONSTRAINED_EXTRA},
                timeout_s=main.timeout_s,
            )
        )
    return arms


def salted(scenario: Scenario, salt: str) -> Scenario:
    if not scenario.system_prompt:
        return scenario
    return scenario.model_copy(update={"system_prompt": f"[{salt}] {scenario.system_prompt}"})


def expected_steps(scenario: Scenario, cfg: SweepConfig, level: float) -> int:
    per_task = scenario.mean_steps()
    tasks = cfg.open_tasks if cfg.mode == "open" else int(level) * cfg.tasks_per_agent
    return max(1, round(per_task * tasks))


async def run_sweep(
    arms: list[TargetConfig],
    scenario: Scenario,
    cfg: SweepConfig,
    console: Console | None = None,
    http_client: Any = None,
) -> RunResult:
    """Run every level for every arm; ``http_client`` is for tests (mock transport)."""
    console = console or Console(stderr=True)
    targets = [await OpenAITarget(a, http_client).open() for a in arms]
    nonce = new_nonce() if scenario.fresh_schemas else ""
    schemas = {t.name: SchemaState() for t in targets}
    result = RunResult(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        mode=cfg.mode,
        config=cfg.public() | {"schema_nonce": nonce},
        scenario=scenario.summary(),
        targets=[a.public() for a in arms],
    )
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            if cfg.prewarm and cfg.mode == "closed":
                warm_cfg = replace(cfg, tasks_per_agent=len(scenario.tasks))
                for target in targets:
                    lv = await _run_level(target, scenario, warm_cfg, 1, nonce, schemas, progress)
                    result.notes.append(
                        f"prewarm ({target.name}): {lv.summary.steps} steps of one agent over "
                        f"every task, {lv.summary.cold_steps} of them cold, not counted"
                    )
            for i, level in enumerate(cfg.levels):
                order = targets[i % len(targets) :] + targets[: i % len(targets)]
                stop = False
                for target in order:
                    lv = await _run_level(target, scenario, cfg, level, nonce, schemas, progress)
                    result.levels.append(lv)
                    if target.name == targets[0].name and lv.summary.saturated:
                        stop = True
                if stop and level != cfg.levels[-1]:
                    result.notes.append(
                        f"sweep stopped after level {level:g}: "
                        f"{_reason(result, targets[0].name, level)}"
                    )
                    break
    finally:
        for t in targets:
            await t.close()
    finish_result(result, cfg, main=targets[0].name)
    return result


def _reason(result: RunResult, arm: str, level: float) -> str:
    for lv in result.levels:
        if lv.summary.arm == arm and lv.summary.level == level:
            return lv.summary.stop_reason or "saturated"
    return "saturated"


async def _run_level(
    target: OpenAITarget,
    scenario: Scenario,
    cfg: SweepConfig,
    level: float,
    nonce: str,
    schemas: dict[str, SchemaState],
    progress: Progress,
) -> LevelResult:
    unit = "agents" if cfg.mode == "closed" else "tasks/s"
    shape = LoadShape(
        mode=cfg.mode,
        level=level,
        tasks_per_agent=cfg.tasks_per_agent,
        open_tasks=cfg.open_tasks,
        warmup_s=cfg.warmup_s,
        max_duration_s=cfg.max_level_s,
        saturation_cap_s=cfg.saturation_cap_s,
        seed=cfg.seed,
    )
    label = f"{target.name:>13} {level:g} {unit}"
    bar = progress.add_task(label, total=expected_steps(scenario, cfg, level))
    lat: list[float] = []

    def on_step(rec: StepRecord) -> None:
        lat.append(rec.latency_s)
        flag = "" if rec.ok else f"  error {rec.status or ''}"
        desc = f"{label}  p50 {percentile(lat, 50):5.1f}s{flag}"
        progress.update(bar, advance=1, description=desc)

    salt = f"{nonce or 'run'}-{target.name}-{level:g}-{cfg.seed}"
    sc = salted(scenario, salt)
    if target.cfg.tool_choice:
        sc = sc.model_copy(update={"tool_choice": target.cfg.tool_choice})
    runner = LevelRunner(target, sc, shape, target.name, nonce, schemas[target.name], on_step)
    before = await target.scrape_metrics()
    cpu0 = time.process_time()
    run = await runner.execute()
    cpu = time.process_time() - cpu0
    after = await target.scrape_metrics()
    summary = summarize(
        target.name, level, cfg.mode, run.steps, run.tasks, cfg.slo_p95_step_s,
        cache_delta(before, after),
    )  # fmt: skip
    summary.engine = engine_delta(before, after)
    summary.client_cpu_s_per_step = cpu / len(run.steps) if run.steps else None
    summary.saturated = run.saturated
    summary.stop_reason = run.stop_reason
    return LevelResult(summary, run.steps, run.tasks, run.wall_s, run.dropped)


def finish_result(result: RunResult, cfg: SweepConfig, main: str = "ours") -> None:
    """Batching gain, comparisons and the plan, from the levels already in ``result``."""
    result.batching_gain, result.batching_levels = batching_gain(result, main)
    arms = result.arms()
    result.comparisons = []
    for other, what in (("baseline", "ours vs baseline"), ("unconstrained", "constrained cost")):
        if other in arms:
            result.comparisons += compare_arms(result, main, other, what)
    if cfg.mode == "closed":
        result.plan = make_plan(
            result, cfg.plan_agents, cfg.slo_p95_step_s, cfg.min_goodput, arm=main
        )
