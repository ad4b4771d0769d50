"""The replica model, its fit, the hold-out check and the modelled plan, against cases
computed by hand and against sweeps scripted from a known model (no server)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopstack.bench.cli import app
from loopstack.bench.load import ScenarioError
from loopstack.bench.load.capacity import capacity_plan, per_replica, split_agents, token_hit_rate
from loopstack.bench.load.holdout import HoldoutRow, shapes_by_step
from loopstack.bench.load.metrics import LevelSummary, StepRecord, TaskRecord, dist, summarize
from loopstack.bench.load.modelled import validate
from loopstack.bench.load.report import write_report
from loopstack.bench.load.result import LevelResult, RunResult, load_result
from loopstack.bench.load.scenario import (
    FixedSampler,
    LogNormal,
    Replay,
    Uniform,
    parse_distribution,
)
from loopstack.bench.load.simulate import (
    EngineModel,
    Observed,
    StepShape,
    Workload,
    fit_engine,
    simulate,
    simulate_many,
)

ONE = [[StepShape(prompt=10, cached=0, completion=5)]]


def wl(agents: int, shapes: list[list[StepShape]] = ONE, tool: float = 0.0,
       tasks: int = 1) -> Workload:  # fmt: skip
    return Workload(agents, tasks, shapes, FixedSampler(tool))


# --- the simulator against hand-computed cases -------------------------------------------


def test_one_agent_latency_is_its_iterations() -> None:
    m = EngineModel(iter_s=0.1, decode_seq_s=0.0, prefill_token_s=0.0)
    r = simulate(m, wl(1))
    # 5 completion tokens: the prefill iteration gives the first, four decode iterations
    assert r.latencies == pytest.approx([0.5])
    assert r.steps_per_s == pytest.approx(2.0)


def test_prefill_cost_and_overhead_add_up() -> None:
    m = EngineModel(iter_s=0.1, decode_seq_s=0.0, prefill_token_s=0.01, overhead_s=0.2)
    r = simulate(m, wl(1))
    assert r.latencies == pytest.approx([0.2 + 0.5 + 10 * 0.01])


def test_cached_tokens_are_not_prefilled() -> None:
    m = EngineModel(iter_s=0.0, decode_seq_s=0.0, prefill_token_s=0.01)
    shapes = [[StepShape(prompt=100, cached=80, completion=1)]]
    assert simulate(m, wl(1, shapes)).latencies == pytest.approx([0.2])
    # a what-if hit rate replaces the measured cached share; half the misses halves it
    assert simulate(m, Workload(1, 1, shapes, FixedSampler(0), hit_rate=0.5)).latencies == (
        pytest.approx([0.5])
    )
    half = Workload(1, 1, shapes, FixedSampler(0), miss_scale=0.5)
    assert simulate(m, half).latencies == pytest.approx([0.1])


def test_batching_is_free_or_not_by_the_split() -> None:
    free = EngineModel(iter_s=0.1, decode_seq_s=0.0, prefill_token_s=0.0)
    none = EngineModel(iter_s=0.0, decode_seq_s=0.1, prefill_token_s=0.0)
    # four agents: a fixed iteration cost is shared, a per-sequence one is not (the
    # prefill iteration gives each its first token; four decode iterations of 4 x 0.1 s)
    assert simulate(none, wl(1)).latencies == pytest.approx([0.4])
    assert simulate(free, wl(4)).latencies == pytest.approx([0.5] * 4)
    assert simulate(none, wl(4)).latencies == pytest.approx([1.6] * 4)
    assert simulate(free, wl(4)).steps_per_s == pytest.approx(8.0)
    assert simulate(none, wl(4)).steps_per_s == pytest.approx(2.5)


def test_token_budget_chunks_a_long_prefill() -> None:
    m = EngineModel(iter_s=0.1, decode_seq_s=0.0, prefill_token_s=0.0, token_budget=4)
    shapes = [[StepShape(prompt=10, cached=0, completion=1)]]
    # 10 prompt tokens at 4 per iteration: three iterations, the last gives the token
    assert simulate(m, wl(1, shapes)).latencies == pytest.approx([0.3])


def test_closed_loop_tool_pauses_and_tasks() -> None:
    m = EngineModel(iter_s=0.1, decode_seq_s=0.0, prefill_token_s=0.0)
    shapes = ONE * 3  # three steps per task
    r = simulate(m, wl(1, shapes, tool=1.0, tasks=2))
    assert len(r.latencies) == 6 and len(r.task_latencies) == 2
    # a task: three 0.5 s steps, each followed by its 1 s tool (the last one's too, as the
    # load test runs it); the six steps span 0 -> 8.0 s (the second task starts at 4.5)
    assert r.task_latencies == pytest.approx([4.5, 4.5])
    assert r.steps_per_s == pytest.approx(6 / 8.0)


def test_simulation_is_seeded() -> None:
    m = EngineModel(iter_s=0.01, decode_seq_s=0.01, prefill_token_s=0.001)
    shapes = [[StepShape(100, 0, 3), StepShape(300, 100, 9)]] * 3
    tool = parse_distribution("lognormal:0.3,0.5").sampler()
    w = Workload(6, 2, shapes, tool)
    assert simulate(m, w, seed=3).latencies == simulate(m, w, seed=3).latencies
    assert simulate(m, w, seed=3).latencies != simulate(m, w, seed=4).latencies


# --- the fit recovers a known model ------------------------------------------------------

TRUE = EngineModel(iter_s=0.02, decode_seq_s=0.03, prefill_token_s=0.002, overhead_s=0.1)
SHAPES = [
    [StepShape(400, 0, 12), StepShape(420, 16, 14)],
    [StepShape(560, 400, 10), StepShape(580, 416, 16)],
    [StepShape(700, 560, 12), StepShape(720, 576, 12)],
]
TOOL = FixedSampler(0.3)


def observe(model: EngineModel, agents: int) -> Observed:
    sim = simulate_many(model, Workload(agents, 2, SHAPES, TOOL), reps=4, seed=100)
    flat = [s for st in SHAPES for s in st]
    unc = sum(s.prompt - s.cached for s in flat) / len(flat)
    comp = sum(s.completion for s in flat) / len(flat)
    one = model.iter_s + model.decode_seq_s
    return Observed(
        agents,
        sim.p(50) or 0,
        sim.p(95) or 0,
        sim.steps_per_s or 0,
        engine_e2e_s=(sim.p(50) or 0) - model.overhead_s,
        engine_prefill_s=unc * model.prefill_token_s,
        engine_decode_s=(comp - 1) * one,
        uncached_mean=unc,
        completion_mean=comp,
    )


def test_fit_recovers_the_split_and_predicts_a_level_it_did_not_see() -> None:
    obs = [observe(TRUE, n) for n in (1, 4, 16)]
    fit = fit_engine(obs, lambda n: Workload(n, 2, SHAPES, TOOL))
    # 0.03 of 0.05 s is per sequence; the split trades off against the prefill share (the
    # fit lands on a neighbour: split ~0.72, share ~0.86), the one-sequence iteration exact
    assert fit.split == pytest.approx(0.6, abs=0.15)
    assert fit.model.iter_s + fit.model.decode_seq_s == pytest.approx(0.05)
    assert fit.error < 0.1
    held = observe(TRUE, 8)
    pred = simulate_many(fit.model, Workload(8, 2, SHAPES, TOOL), reps=4)
    assert (pred.steps_per_s or 0) / held.steps_per_s == pytest.approx(1.0, abs=0.1)
    assert (pred.p(95) or 0) / held.p95_s == pytest.approx(1.0, abs=0.15)


def test_a_wrong_model_shows_its_error() -> None:
    """The fit cannot hide a curve its model does not have: a server that gets slower
    with the square of the load leaves a large fit error (the check can fail)."""
    obs = [observe(TRUE, n) for n in (1, 4, 16)]
    for o in obs:
        o.p50_s *= (o.agents / 4) ** 2
        o.steps_per_s /= (o.agents / 4) ** 2
    fit = fit_engine(obs, lambda n: Workload(n, 2, SHAPES, TOOL))
    assert fit.error > 0.3


# --- the hold-out check on a saved sweep --------------------------------------------------


def scripted_result(model: EngineModel, levels: list[int], tasks: int = 2) -> RunResult:
    """A RunResult whose levels were 'measured' on the scripted model (the simulator)."""
    rng = random.Random(7)
    out = []
    for n in levels:
        sim = simulate(model, Workload(n, tasks, SHAPES, TOOL), seed=n)
        steps, t = [], 0.0
        for i, lat in enumerate(sim.latencies):
            shape = rng.choice(SHAPES[i % 3])
            steps.append(
                StepRecord("ours", n, i % n, 0, i % 3, t, lat, lat / 2, True,
                           prompt_tokens=shape.prompt, completion_tokens=shape.completion,
                           cached_tokens=shape.cached, tool_calls=1)
            )  # fmt: skip
            t += sim.window_s / max(1, len(sim.latencies))
        tasks_rec = [TaskRecord("ours", n, a, 0, "t", 0.0, tl, 3, "done")
                     for a, tl in enumerate(sim.task_latencies)]  # fmt: skip
        s = summarize("ours", n, "closed", steps, tasks_rec, 10.0)
        s.steps_per_s = sim.steps_per_s
        s.step_latency = dist(sim.latencies)
        out.append(LevelResult(s, steps, tasks_rec))
    scenario = {"tools": ["a", "b"], "tool_latency": {"default": {"kind": "fixed", "value": 0.3}}}
    return RunResult("now", "closed", {"tasks_per_agent": tasks}, scenario, [], out)


def test_validate_reports_predicted_over_measured() -> None:
    res = scripted_result(TRUE, [1, 4, 8, 16])
    val, _fit, _ = validate(res, [1, 4, 16], [8], reps=4)
    assert [r.role for r in val.rows] == ["fit", "fit", "holdout", "fit"]
    row = next(r for r in val.rows if r.role == "holdout")
    assert row.error("steps_per_s") == pytest.approx(
        row.predicted_steps_per_s / row.measured_steps_per_s - 1  # type: ignore[operator]
    )
    # no engine histograms in this result: the fit falls back to decode iterations only
    assert val.prefill_token_s == 0.0 and val.overhead_s == 0.0
    assert val.worst("steps_per_s") is not None and val.worst("steps_per_s") < 0.2
    assert any("held-out" in line for line in val.lines())
    assert any("tool latency" in a for a in val.assumptions)


def test_validate_refuses_levels_the_sweep_lacks() -> None:
    from loopstack.bench.load import BenchError

    with pytest.raises(BenchError, match="not in the result"):
        validate(scripted_result(TRUE, [1, 4]), [1, 4], [8])


def test_holdout_row_error_is_signed_and_none_without_a_measurement() -> None:
    r = HoldoutRow(8, "holdout", 2.0, 4.0, 1.0, 2.2, 3.4, 1.1)
    assert r.error("p95_s") == pytest.approx(-0.15)
    assert r.error("steps_per_s") == pytest.approx(0.1)
    assert HoldoutRow(8, "holdout", None, None, None, 1, 1, 1).error("p50_s") is None


def test_shapes_by_step_groups_successful_steps() -> None:
    recs = [
        StepRecord("ours", 1, 0, 0, 0, 0, 1, None, True, prompt_tokens=10, cached_tokens=2),
        StepRecord("ours", 1, 0, 0, 1, 0, 1, None, True, prompt_tokens=20),
        StepRecord("ours", 1, 0, 0, 1, 0, 1, None, False, prompt_tokens=99),
    ]
    assert shapes_by_step(recs) == [[StepShape(10, 2, 0)], [StepShape(20, 0, 0)]]


# --- the modelled plan --------------------------------------------------------------------


def test_per_replica_and_replicas_from_the_model() -> None:
    m = EngineModel(iter_s=0.0, decode_seq_s=0.1, prefill_token_s=0.0)  # no batching
    # one agent: 0.4 s steps; n agents at once: 0.4 n s -> p95 <= 1.8 s holds up to 4
    c, points = per_replica(m, lambda n: wl(n), slo_step=1.8, slo_task=None, reps=1)
    assert c == 4 and [p.meets for p in points][:5] == [True] * 4 + [False]
    plan = capacity_plan(m, lambda n: wl(n), agents_target=10, slo_p95_step_s=1.8, reps=1)
    assert plan.per_replica == 4 and plan.replicas == 3
    assert "10 agents need 3 replica(s)" in plan.lines()[0]


def test_task_slo_tightens_the_plan() -> None:
    m = EngineModel(iter_s=0.0, decode_seq_s=0.1, prefill_token_s=0.0)
    make = lambda n: wl(n, ONE * 3)  # noqa: E731 - three 0.4 n s steps per task
    c, _ = per_replica(m, make, slo_step=1.8, slo_task=None, reps=1)
    c_task, _ = per_replica(m, make, slo_step=1.8, slo_task=3.0, reps=1)
    assert c == 4 and c_task == 2


def test_half_the_misses_needs_fewer_replicas() -> None:
    m = EngineModel(iter_s=0.0, decode_seq_s=0.01, prefill_token_s=0.01)
    shapes = [[StepShape(prompt=100, cached=20, completion=2)]]
    plan = capacity_plan(
        m, lambda n: wl(n, shapes), 40, 4.0, hit_rate=token_hit_rate(shapes), reps=1
    )
    assert plan.hit_rate == pytest.approx(0.2) and plan.better_hit_rate == pytest.approx(0.6)
    assert plan.better_per_replica > plan.per_replica
    assert plan.better_replicas is not None and plan.replicas is not None
    assert plan.better_replicas < plan.replicas


def test_replica_prediction_spreads_agents() -> None:
    assert split_agents(9, 2) == [5, 4] and split_agents(3, 4) == [1, 1, 1, 0]
    m = EngineModel(iter_s=0.0, decode_seq_s=0.1, prefill_token_s=0.0)
    plan = capacity_plan(m, lambda n: wl(n), 8, 10.0, replica_checks=[(2, 8)], reps=1)
    rp = plan.replica_predictions[0]
    assert rp.per_replica == [4, 4]
    assert rp.p50_step_s == pytest.approx(1.6)  # four agents on each, no batching
    assert rp.steps_per_s == pytest.approx(5.0)  # two replicas at 2.5 steps/s


def test_latency_flags_parse_and_refuse_nonsense() -> None:
    assert parse_distribution("fixed:2").model_dump()["value"] == 2.0
    assert isinstance(parse_distribution("uniform:0.1,0.5"), Uniform)
    ln = parse_distribution("lognormal:0.3")
    assert isinstance(ln, LogNormal) and ln.sigma == 0.5 and ln.max is None
    assert parse_distribution("lognormal:1,0.2,4").max == 4.0  # type: ignore[union-attr]
    assert isinstance(parse_distribution("replay:a.jsonl,b.jsonl"), Replay)
    for bad in ("gauss:1", "fixed:x", "uniform:2,1", "lognormal:", "fixed:1,2"):
        with pytest.raises(ScenarioError):
            parse_distribution(bad)


# --- the command and the report -----------------------------------------------------------


def test_plan_command_checks_holdout_and_writes_the_report(tmp_path: Path) -> None:
    res = scripted_result(TRUE, [1, 4, 8, 16])
    src = tmp_path / "run" / "result.json"
    write_report(res, src.parent)
    two = tmp_path / "two" / "result.json"
    write_report(scripted_result(TRUE, [8]), two.parent)  # stands in for a 2-replica run
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, [
        "plan", str(src), "--agents", "40", "--slo-p95-step-s", "5", "--fit", "1,4,16",
        "--holdout", "8", "--slo-p95-task-s", "30", "--tool-latency", "lognormal:0.5,0.4",
        "--measured-replicas", f"{two},{two}", "--replicas", "2", "--out", str(out),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "holdout   8 agents" in r.output and "worst held-out error on p95 step" in r.output
    assert "modelled plan:" in r.output and "half the prefix-cache misses" in r.output
    assert "2 replica(s), 16 agents ([8, 8])" in r.output and "error" in r.output
    saved = load_result(out / "result.json")
    assert saved.validation is not None and saved.validation.holdout_levels == [8]
    assert saved.capacity is not None and saved.capacity.slo_p95_task_s == 30
    assert saved.capacity.replica_predictions[0].measured_steps_per_s is not None
    page = (out / "report.html").read_text()
    assert "Measured prediction error on held-out levels [8]" in page
    assert "The model assumes:" in page and "lognormal:0.5,0.4" in page
    raw = json.loads((out / "result.json").read_text())
    assert math.isfinite(raw["validation"]["rows"][2]["predicted_p95_s"])


def test_plan_command_refuses_a_missing_level(tmp_path: Path) -> None:
    write_report(scripted_result(TRUE, [1, 4]), tmp_path)
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "result.json"), "--agents", "4",
                                 "--slo-p95-step-s", "5", "--holdout", "8"])  # fmt: skip
    assert r.exit_code == 2 and "not in the result" in r.output


def test_level_summary_fields_used_by_the_fit_exist() -> None:
    # the fit reads these LevelSummary fields of saved results
    names = LevelSummary.__dataclass_fields__
    assert {"engine", "step_latency", "steps_per_s", "task_latency", "warm_steps"} <= set(names)


# --- the pause sweep ----------------------------------------------------------------------


def test_pause_sweep_tabulates_hit_rate_per_pause_and_level(tmp_path: Path) -> None:
    import asyncio

    from loopstack.bench.load.metrics import prom_labels_value
    from loopstack.bench.load.pauses import kv_cache_tokens, run_pauses, save_rows, table
    from loopstack.bench.load.scenario import parse_scenario
    from loopstack.bench.load.target import TargetConfig
    from tests.unit.bench.test_agents_harness import SCENARIO, FakeServer, httpx

    server = FakeServer()

    def http() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(server))

    target = TargetConfig("ours", "http://fake/v1", "k")
    rows = asyncio.run(
        run_pauses(target, parse_scenario(SCENARIO), [0.01, 0.05], [1, 2], http_factory=http)
    )
    assert [(r.pause_s, r.agents) for r in rows] == [(0.01, 1), (0.01, 2), (0.05, 1), (0.05, 2)]
    assert all(r.hit_rate == pytest.approx(0.25) for r in rows)  # the fake's counters
    assert all(r.steps == 3 * r.agents for r in rows)  # one three-step task per agent
    head, body = table(rows)
    assert len(body) == 4 and body[0][3] == "0.25" and "hit rate (vLLM)" in head
    assert asyncio.run(kv_cache_tokens(target, http())) is None  # the fake has no info gauge
    save_rows(rows, 1234, tmp_path / "p.json")
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["kv_cache_tokens"] == 1234 and len(saved["rows"]) == 4
    info = 'vllm:cache_config_info{block_size="128",kv_cache_size_tokens="174720"} 1.0'
    assert prom_labels_value(info, "vllm:cache_config_info", "kv_cache_size_tokens") == 174720
    assert prom_labels_value(info, "vllm:cache_config_info", "nothing") is None


def test_holdout_on_a_sweep_against_a_scripted_target() -> None:
    """The whole path on a scripted target (mock transport): a server that is slower the more
    requests it holds; the sweep, then the fit on 1 and 4 agents and the check on 2. Only the
    plumbing is asserted (wall-clock sleeps set the figures)."""
    import asyncio

    from loopstack.bench.load.runner import SweepConfig, build_arms, run_sweep
    from loopstack.bench.load.scenario import parse_scenario
    from loopstack.bench.load.target import TargetConfig
    from tests.unit.bench.test_agents_harness import SCENARIO, FakeServer, httpx

    class Loaded(FakeServer):
        inflight = 0

        async def __call__(self, request: httpx.Request) -> httpx.Response:
            if not request.url.path.endswith("/chat/completions"):
                return await super().__call__(request)
            Loaded.inflight += 1
            self.delay = 0.01 * Loaded.inflight
            try:
                return await super().__call__(request)
            finally:
                Loaded.inflight -= 1

    http = httpx.AsyncClient(transport=httpx.MockTransport(Loaded()))
    arms = build_arms(TargetConfig("ours", "http://fake/v1", "k"), None, False)
    cfg = SweepConfig(levels=[1, 2, 4], tasks_per_agent=2, prewarm=True)
    res = asyncio.run(run_sweep(arms, parse_scenario(SCENARIO), cfg, http_client=http))
    assert any("prewarm" in n for n in res.notes) and len(res.levels) == 3
    val, fit, _ = validate(res, [1, 4], [2], reps=2)
    assert [r.role for r in val.rows] == ["fit", "holdout", "fit"]
    held = val.rows[1]
    assert held.measured_steps_per_s and held.predicted_steps_per_s
    assert held.error("steps_per_s") is not None and math.isfinite(fit.error)
