"""The agent load harness against the real server: a prewarm, then one and two agents, one
short task each, real tool calls in required mode, a report written, /metrics read, the
capacity model checked on the level it did not see (budget: about a minute)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from loopstack.bench.load.report import write_report
from loopstack.bench.load.runner import SweepConfig, run_sweep
from loopstack.bench.load.scenario import Scenario, load_scenario
from loopstack.bench.load.target import TargetConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
API_KEY = "test-key-123"


def short_scenario() -> Scenario:
    """Two steps of the shipped scenario, short replies, quick simulated tools, one small
    tool per task (one grammar to compile on first use)."""
    sc = load_scenario()
    return sc.model_validate(
        sc.model_dump()
        | {
            "max_tokens": 32,
            "tool_latency": {"default": {"kind": "fixed", "value": 0.05}},
            "tasks": [
                t.model_dump() | {"steps": 2, "tools": ["search_code"]} for t in sc.tasks[:2]
            ],
        }
    )


def test_a_sweep_against_the_server_and_its_plan_checked_on_a_level_it_did_not_see(
    server: object, tmp_path: Path
) -> None:
    """One small real sweep (a prewarm, then 1 and 2 agents, one task each): every step a real
    tool call, the context grown, /metrics read, a report written; then the replica model
    fitted on one agent and asked for two: the prediction error is a number, the report names
    it and its assumptions. No bound on the error here: two steps per agent cannot measure a
    p95 (the bench does). (Was two tests, each with its own sweep: the 2-agent level ran twice.)"""
    from loopstack.bench.load.modelled import ModelPlanOptions, model_plan

    sc = short_scenario()
    base = server.base_url + "/v1"  # type: ignore[attr-defined]
    cfg = SweepConfig(
        levels=[1, 2], tasks_per_agent=1, max_level_s=200, slo_p95_step_s=60, prewarm=True
    )
    res = asyncio.run(run_sweep([TargetConfig("ours", base, API_KEY)], sc, cfg))
    # the prewarm ran every task once, unmeasured: the first use of the tool set was cold there
    warm_note = next(n for n in res.notes if "prewarm" in n)
    cold = re.search(r"(\d+) of them cold", warm_note)
    assert cold and int(cold.group(1)) >= 1, warm_note
    assert all(lv.summary.errors == 0 for lv in res.levels), [
        x.error for lv in res.levels for x in lv.steps if not x.ok
    ]
    lv = res.levels[1]
    s = lv.summary
    assert s.level == 2 and s.steps == 4 and {t.outcome for t in lv.tasks} == {"done"}
    assert s.cold_steps == 0  # the prewarm took the cold ones
    for x in (x for level in res.levels for x in level.steps):
        # every step returned a real call to one of the offered (renamed) tools
        assert x.tool_calls >= 1 and x.finish_reason == "tool_calls", x
        assert x.ttft_s is not None and 0 < x.ttft_s <= x.latency_s, x
    # the context grew: the second step of each task saw the first call and its result
    firsts = {x.agent: x.prompt_tokens for x in lv.steps if x.step == 0}
    assert all(x.prompt_tokens > firsts[x.agent] + 50 for x in lv.steps if x.step == 1)
    assert s.output_tok_s and s.output_tok_s > 0
    assert s.cache.queries is not None and s.cache.queries > 0  # vLLM's counters moved
    # the engine's histograms moved at the fit level: the fit starts from them
    assert res.levels[0].summary.engine.get("decode_s")
    opts = ModelPlanOptions(fit=[1], holdout=[2], agents=10, slo_p95_step_s=60)
    lines = model_plan(res, opts)
    assert res.validation is not None and res.capacity is not None
    held = next(r for r in res.validation.rows if r.role == "holdout")
    assert held.agents == 2 and held.error("steps_per_s") is not None
    assert held.predicted_p50_s is not None and held.predicted_p50_s > 0
    assert any("worst held-out error on steps/s" in line for line in lines)
    paths = write_report(res, tmp_path)
    assert (tmp_path / "report.html").stat().st_size > 10_000 and len(paths) == 8
    page = (tmp_path / "report.html").read_text()
    assert "Measured prediction error on held-out levels [2]" in page
    assert "The model assumes:" in page
