"""Scenario parsing, latency distributions (seeded) and trace replay."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from loopstack.bench.load import ScenarioError
from loopstack.bench.load.scenario import (
    LogNormal,
    ReplaySampler,
    ToolSimulator,
    Uniform,
    load_scenario,
    parse_scenario,
    rename_tool,
)

TOOL = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
}


def minimal(**kw: object) -> dict[str, object]:
    return {"tools": [TOOL], "tasks": [{"name": "t", "prompt": "p"}], **kw}


def test_default_scenario_parses() -> None:
    sc = load_scenario()
    assert sc.tool_choice == "required" and len(sc.tools) >= 3 and len(sc.tasks) >= 2
    assert sc.mean_steps() == 3
    task = sc.tasks[0]
    names = [t["function"]["name"] for t in sc.tools_for(task, "ab12")]
    assert all(n.endswith("__ab12") for n in names)
    assert sc.tool_latency.per_tool["run_tests"].kind == "uniform"


def test_yaml_and_json_files(tmp_path: Path) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps(minimal(think_time={"kind": "uniform", "low": 1, "high": 2})))
    sc = load_scenario(f)
    assert isinstance(sc.think_time, Uniform)
    y = tmp_path / "s.yaml"
    y.write_text("tools: []\ntool_choice: none\ntasks:\n  - {name: a, prompt: hi, steps: 2}\n")
    assert load_scenario(y).tasks[0].steps == 2


@pytest.mark.parametrize(
    "bad",
    [
        minimal(tasks=[]),  # no task
        minimal(tasks=[{"name": "t", "prompt": "p", "tools": ["nope"]}]),
        minimal(tools=[TOOL, TOOL]),  # duplicate names
        {"tools": [], "tasks": [{"name": "t", "prompt": "p"}]},  # required without tools
        minimal(think_time={"kind": "uniform", "low": 3, "high": 1}),
        minimal(think_time={"kind": "gamma"}),
        minimal(unknown_key=1),
    ],
)
def test_bad_scenarios_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ScenarioError):
        parse_scenario(bad)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError):
        load_scenario(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("tools: [unclosed")
    with pytest.raises(ScenarioError):
        load_scenario(tmp_path / "x.yaml")


def test_distributions_are_seeded_and_shaped() -> None:
    u = Uniform(low=1.0, high=3.0).sampler()
    a = [u.sample(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]  # same seed, same draw
    xs = [u.sample(r) for r in [random.Random(1)] for _ in range(2000)]
    assert min(xs) >= 1.0 and max(xs) <= 3.0 and abs(statistics.mean(xs) - 2.0) < 0.05
    ln = LogNormal(median=0.5, sigma=0.8, max=None).sampler()
    rng = random.Random(3)
    ys = [ln.sample(rng) for _ in range(4000)]
    assert abs(statistics.median(ys) - 0.5) < 0.05
    assert ln.mean() == pytest.approx(0.5 * math.exp(0.32))
    capped = LogNormal(median=1.0, sigma=2.0, max=2.0).sampler()
    assert max(capped.sample(rng) for _ in range(500)) <= 2.0


def test_replay_from_agent_traces(tmp_path: Path) -> None:
    lines = [
        {"run_id": "r", "trace_id": "t", "step": 0, "type": "model", "ts": 1, "latency_s": 9.0},
        {"run_id": "r", "trace_id": "t", "step": 0, "type": "tool", "ts": 2, "latency_s": 0.25,
         "name": "search", "arguments": "{}", "status": "ok", "result_summary": "",
         "result_chars": 10},
        {"run_id": "r", "trace_id": "t", "step": 1, "type": "tool", "ts": 3, "latency_s": 4.0,
         "name": "run_tests", "arguments": "{}", "status": "ok", "result_summary": "",
         "result_chars": 10},
    ]  # fmt: skip
    (tmp_path / "run1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    s = ReplaySampler.from_files([str(tmp_path / "*.jsonl")])
    rng = random.Random(0)
    assert {s.sample(rng, "search__ab12") for _ in range(20)} == {0.25}  # per tool name
    assert {s.sample(rng, "run_tests") for _ in range(20)} == {4.0}
    assert {s.sample(rng, "other") for _ in range(50)} == {0.25, 4.0}  # pooled fallback
    assert s.mean() == pytest.approx(2.125)  # model lines are not tool latency
    sc = parse_scenario(
        minimal(
            tool_latency={"default": {"kind": "replay", "traces": [str(tmp_path / "run1.jsonl")]}}
        )
    )
    assert ToolSimulator(sc).latency(rng, "search") == 0.25
    with pytest.raises(ScenarioError):
        ReplaySampler.from_files([str(tmp_path / "none*.jsonl")])


def test_tool_results_have_the_configured_size() -> None:
    sc = parse_scenario(minimal(result_chars=500))
    sim = ToolSimulator(sc)
    r1 = sim.result(random.Random(1), "search__x", '{"q": "a"}')
    r2 = sim.result(random.Random(1), "search__x", '{"q": "a"}')
    assert r1 == r2 and 450 <= len(r1) <= 520
    assert json.loads(r1)["tool"] == "search"
    assert rename_tool(TOOL, "")["function"]["name"] == "search"
