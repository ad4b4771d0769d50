"""The GPU fleet plan: the prefix-cache cliff, the binding limit, the command, and the CPU
plan's hold-out check on the committed sweep (fit 1, 4, 8; predict 12, 16 within 15 %)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopstack.bench.load.architecture import load_architecture
from loopstack.bench.load.gpuplan import _Model, gpu_plan
from loopstack.bench.load.hardware import get_hardware
from loopstack.bench.load.kvcache import cliff, uncached_mean
from loopstack.bench.load.roofline import ReplicaSpec, fit_coefficients
from loopstack.bench.load.workload import AgentWorkload, load_workload

SWEEP = Path("docs/results/second-core-2026-12-04/sweep/result.json")
WL = AgentWorkload(output_tokens=150, output_tokens_p95=300)


def test_uncached_tokens_by_hand() -> None:
    wl = AgentWorkload(steps=3, shared_prefix_tokens=1000, first_prompt_tokens=200,
                       output_tokens=100, tool_result_tokens=300)  # fmt: skip
    # contexts 1200, 1600, 2000; hit: 200, 300, 300; miss: 200, 600, 1000
    assert uncached_mean(wl, 1.0) == pytest.approx((200 + 300 + 300) / 3)
    assert uncached_mean(wl, 0.0) == pytest.approx((200 + 600 + 1000) / 3)


def test_the_cache_holds_then_falls_off_a_cliff() -> None:
    m = _Model(ReplicaSpec(get_hardware("h100"), load_architecture("Qwen/Qwen3-8B")),
               fit_coefficients())  # fmt: skip
    states = [m.state(WL, n) for n in (1, 50, 100, 200, 260)]
    hits = [s.hit for s in states]
    assert hits[0] == pytest.approx(1.0) and hits == sorted(hits, reverse=True)
    assert hits[-1] < 0.5  # past the cliff resumed steps re-prefill
    c = cliff(states)
    assert c is not None and 100 <= c < 260
    p95 = [s.p95_step_s for s in states]
    assert p95 == sorted(p95)


def test_more_memory_moves_the_cliff_out() -> None:
    qwen = load_architecture("Qwen/Qwen3-8B")
    h100 = _Model(ReplicaSpec(get_hardware("h100"), qwen), fit_coefficients())
    h200 = _Model(ReplicaSpec(get_hardware("h200"), qwen), fit_coefficients())
    assert h200.kv > 2 * h100.kv
    assert h200.state(WL, 260).hit > h100.state(WL, 260).hit


def test_plan_is_labelled_modelled_and_rounds_up() -> None:
    spec = ReplicaSpec(get_hardware("h100"), load_architecture("Qwen/Qwen3-8B"))
    p = gpu_plan(spec, WL, 500, 10.0, cost_per_hour=3.0)
    assert p.per_replica > 0 and p.replicas == math.ceil(500 / p.per_replica)
    assert p.at_cstar is not None and p.at_cstar.p95_step_s <= 10.0
    text = "\n".join(p.lines())
    assert "MODELLED, not measured" in text and "; measured" not in text
    assert p.cost_per_1000_tasks == pytest.approx(1000 * (p.gpu_s_per_task or 0) * 3.0 / 3600)
    assert p.binding


def test_kv_capacity_binds_a_long_context_on_a_small_card() -> None:
    wl = AgentWorkload(steps=10, shared_prefix_tokens=0, first_prompt_tokens=20000,
                       output_tokens=200, tool_result_tokens=4000)  # fmt: skip
    spec = ReplicaSpec(get_hardware("l40s"), load_architecture("meta-llama/Llama-3.1-8B-Instruct"))
    p = gpu_plan(spec, wl, 100, 600.0)
    assert "KV capacity" in p.binding


def test_the_command(tmp_path: Path) -> None:
    from loopstack.bench.cli import app

    wl = tmp_path / "wl.yaml"
    wl.write_text("kind: agents\nsteps: 4\noutput_tokens: 120\ntool_pause: fixed:1\n")
    assert load_workload(wl).kind == "agents"
    r = CliRunner().invoke(app, ["plan", "--hardware", "h100", "--model", "Qwen/Qwen3-8B",
                                 "--tp", "1", "--agents", "500", "--slo-p95-step", "10s",
                                 "--workload", str(wl)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "MODELLED" in r.output and "replica(s)" in r.output
    bad = CliRunner().invoke(app, ["plan", "--hardware", "tpu9", "--model", "Qwen/Qwen3-8B",
                                   "--agents", "5", "--slo-p95-step", "10s"])  # fmt: skip
    assert bad.exit_code == 2 and "unknown hardware" in bad.output


@pytest.mark.skipif(not SWEEP.is_file(), reason="the committed CPU sweep is not here")
def test_cpu_plan_still_extrapolates_within_15_percent() -> None:
    from loopstack.bench.load.modelled import validate
    from loopstack.bench.load.result import load_result

    val, _, _ = validate(load_result(SWEEP), [1, 4, 8], [12, 16])
    for what in ("p95_s", "steps_per_s"):
        worst = val.worst(what)
        assert worst is not None and worst <= 0.15, (what, worst)


@pytest.mark.skipif(not SWEEP.is_file(), reason="the committed CPU sweep is not here")
def test_both_plans_in_one_report(tmp_path: Path) -> None:
    from loopstack.bench.cli import app

    r = CliRunner().invoke(app, ["plan", str(SWEEP), "--agents", "100", "--slo-p95-step-s",
                                 "10", "--hardware", "h100", "--model", "Qwen/Qwen3-8B",
                                 "--out", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "plan: 16 agents/replica" in r.output  # the measured plan, as before
    html = (tmp_path / "report.html").read_text()
    assert "GPU fleet plan (modelled" in html and "Capacity plan" in html


def test_the_gpu_iteration_runs_in_the_cpu_plans_simulator() -> None:
    """One model: the roofline iteration, linearised to the CPU plan's three costs
    (`EngineModel`), simulated iteration by iteration (`loopstack.bench.load.simulate`), gives the
    analytic agent model's step latency (32 agents on an H100, every context cached)."""
    from loopstack.bench.load.roofline import linearised
    from loopstack.bench.load.scenario import parse_distribution
    from loopstack.bench.load.simulate import EngineModel, StepShape, Workload, simulate

    spec = ReplicaSpec(get_hardware("h100"), load_architecture("Qwen/Qwen3-8B"))
    c = fit_coefficients()
    s = _Model(spec, c).state(WL, 32)
    assert s.steady is not None and s.hit > 0.99
    ctx = round(WL.mean_context())
    it, per_seq, per_tok = linearised(spec, c, round(s.steady.decode_seqs), ctx)
    engine = EngineModel(it, per_seq, per_tok, c.request_s + c.request_token_s * ctx, 8192)
    new = [WL.first_prompt_tokens] + [WL.tool_result_tokens] * (WL.steps - 1)
    shapes = [[StepShape(round(WL.context(j)), round(WL.context(j)) - new[j], 150)]
              for j in range(WL.steps)]  # fmt: skip
    sim = simulate(engine, Workload(32, 4, shapes, parse_distribution(WL.tool_pause).sampler()))
    mean = sum(sim.latencies) / len(sim.latencies)
    assert mean == pytest.approx(s.p50_step_s, rel=0.10)
    assert 32 / (mean + WL.pause().mean()) == pytest.approx(s.steps_per_s, rel=0.10)


def test_open_loop_requests_and_sessions(tmp_path: Path) -> None:
    from loopstack.bench.cli import app

    one = tmp_path / "req.yaml"
    one.write_text("kind: requests\nrate: 40\ninput_tokens: 1024\noutput_tokens: 128\n")
    sess = tmp_path / "sess.yaml"
    sess.write_text("kind: requests\nrate: 5\ninput_tokens: 500\noutput_tokens: 200\n"
                    "turns: 8\nthink: fixed:1\nshared_prefix_tokens: 1000\n")  # fmt: skip
    for wl, cached in ((one, False), (sess, True)):
        r = CliRunner().invoke(app, ["plan", "--hardware", "h100", "--model", "Qwen/Qwen3-8B",
                                     "--agents", "1", "--slo-p95-step", "10s",
                                     "--workload", str(wl)])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert "arrivals/s with p95 request <= 10 s" in r.output and "replica(s)" in r.output
        # a 1 s think is well within the cache's reach: later turns cached
        assert ("find the session cached 100%" in r.output) == cached


def test_one_agent_on_an_moe_reads_only_its_experts() -> None:
    """A busy iteration decodes at least one sequence: one agent on Qwen3-30B-A3B reads the
    8 experts its token picks, about the active weights (3.04 B x 2 bytes), not all 128."""
    a = load_architecture("Qwen/Qwen3-30B-A3B")
    c = fit_coefficients()
    s = _Model(ReplicaSpec(get_hardware("h100"), a), c).state(WL, 1)
    active = a.active_params * 2 / (3.35e12 * c.bandwidth_eff)
    assert s.tpot_s == pytest.approx(active, rel=0.10)
    assert s.tpot_s < a.total_params * 2 / (3.35e12 * c.bandwidth_eff) / 5
