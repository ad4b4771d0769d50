"""The whole harness against a fake OpenAI-compatible server (mock transport, no model):
sweep, arms, cold/warm, time limit, report files, and the CLI's plan command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from loopstack.bench.cli import app
from loopstack.bench.load.report import write_report
from loopstack.bench.load.result import load_result, summary_line
from loopstack.bench.load.runner import SweepConfig, build_arms, run_sweep
from loopstack.bench.load.scenario import parse_scenario
from loopstack.bench.load.target import TargetConfig

try:  # the openai client builds on httpx2 in recent releases, on httpx before
    import httpx2 as httpx  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef,unused-ignore]


def tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }


SCENARIO = {
    "tools": [tool("search"), tool("read")],
    "tasks": [{"name": "a", "prompt": "do a", "steps": 3}, {"name": "b", "prompt": "do b"}],
    "result_chars": 100,
    "tool_latency": {"default": {"kind": "fixed", "value": 0.0}},
    "max_tokens": 5,
}


class FakeServer:
    def __init__(self, delay: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.delay = delay
        self.queries = 0.0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "fake"}]})
        if path.endswith("/metrics"):
            self.queries += 100
            text = (
                f'vllm:prefix_cache_queries_total{{engine="0"}} {self.queries}\n'
                f'vllm:prefix_cache_hits_total{{engine="0"}} {self.queries / 4}\n'
            )
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.delay:
            await asyncio.sleep(self.delay)
        return httpx.Response(200, content=sse(body), headers={"content-type": "text/event-stream"})


def sse(body: dict[str, Any]) -> bytes:
    def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> str:
        c: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 0,
                             "model": "fake", "choices": []}  # fmt: skip
        if delta is not None:
            c["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        if usage:
            c["usage"] = usage
        return "data: " + json.dumps(c) + "\n\n"

    tools = body.get("tools") or []
    name = tools[len(body["messages"]) % len(tools)]["function"]["name"] if tools else None
    parts = [chunk({"role": "assistant", "content": ""})]
    if name and body.get("tool_choice") != "none":
        tc = {"index": 0, "id": f"c{len(body['messages'])}", "type": "function",
              "function": {"name": name, "arguments": '{"q": "x"}'}}  # fmt: skip
        parts.append(chunk({"tool_calls": [tc]}))
        parts.append(chunk({}, "tool_calls"))
    else:
        parts += [chunk({"content": "ok "}), chunk({}, "stop")]
    prompt = sum(len(json.dumps(m)) for m in body["messages"]) // 4
    parts.append(chunk(None, usage={"prompt_tokens": prompt, "completion_tokens": 5,
                                    "total_tokens": prompt + 5}))  # fmt: skip
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def run(server: FakeServer, cfg: SweepConfig, **arms: Any) -> Any:
    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    main = TargetConfig("ours", "http://fake/v1", "k")
    base = TargetConfig("baseline", "http://raw/v1", "k") if arms.get("baseline") else None
    targets = build_arms(main, base, bool(arms.get("unconstrained")))
    return asyncio.run(run_sweep(targets, parse_scenario(SCENARIO), cfg, http_client=http))


def test_closed_sweep_with_arms_report_and_plan(tmp_path: Path) -> None:
    server = FakeServer()
    cfg = SweepConfig(levels=[1, 2], tasks_per_agent=1, slo_p95_step_s=5.0, plan_agents=10)
    res = run(server, cfg, baseline=True, unconstrained=True)
    assert res.arms() == ["ours", "baseline", "unconstrained"]
    # arms rotate per level: level 1 ours first, level 2 baseline first
    assert [lv.summary.arm for lv in res.levels[:3]] == ["ours", "baseline", "unconstrained"]
    assert [lv.summary.arm for lv in res.levels[3:]] == ["baseline", "unconstrained", "ours"]
    lv1 = res.levels[0]
    # one agent, task a (3 steps): every step acted on the model's real call
    assert lv1.summary.steps == 3 and lv1.summary.errors == 0
    assert {t.outcome for t in lv1.tasks} == {"done"}
    assert lv1.summary.cold_steps >= 1 and lv1.summary.model_calls_per_task == 3
    assert lv1.summary.cache.hit_rate == 0.25
    # the conversation grows: assistant call + tool result per step
    step3 = [b for b in server.bodies if len(b["messages"]) == 6]
    assert step3 and step3[0]["messages"][-1]["role"] == "tool"
    called = step3[0]["messages"][-2]["tool_calls"][0]["function"]["name"]
    assert called == f"search__{res.config['schema_nonce']}"  # the model's call, renamed tool
    # unconstrained arm sends the switch; the others do not
    assert sum(1 for b in server.bodies if b.get("loopstack") == {"constrained": False}) == 9
    assert all(b["stream_options"] == {"include_usage": True} for b in server.bodies)
    assert res.batching_gain is not None and res.batching_levels == [1, 2]
    assert {c.what for c in res.comparisons} == {"ours vs baseline", "constrained cost"}
    assert res.plan is not None and res.plan.replicas is not None
    assert summary_line(res).startswith("SUMMARY batching gain")

    out = tmp_path / "out"
    paths = write_report(res, out)
    names = {p.name for p in paths}
    assert {"result.json", "levels.csv", "steps.csv", "report.html"} <= names
    assert {"step_latency_vs_agents.png", "throughput_vs_agents.png", "latency_cdf.png",
            "goodput_vs_agents.png"} <= names  # fmt: skip
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "http://" not in page.split("<h2>Plots")[1]
    assert len((out / "steps.csv").read_text().splitlines()) == 1 + sum(
        len(lv.steps) for lv in res.levels
    )
    again = load_result(out / "result.json")
    assert again.plan is not None and again.levels[0].summary.steps == 3

    cli = CliRunner().invoke(
        app, ["plan", str(out / "result.json"), "--agents", "7", "--slo-p95-step-s", "5"]
    )
    assert cli.exit_code == 0, cli.output
    last = cli.output.strip().splitlines()[-1]
    assert "agents/replica" in last and "7 agents need" in last
    priced = CliRunner().invoke(
        app, ["plan", str(out / "result.json"), "--agents", "7", "--slo-p95-step-s", "5",
              "--replica-cost-per-hour", "2.5"]
    )  # fmt: skip
    assert priced.exit_code == 0 and "replica-seconds per task" in priced.output
    assert "1,000 tasks cost" in priced.output
    bad = CliRunner().invoke(
        app, ["plan", str(out / "result.json"), "--agents", "7", "--slo-p95-step-s", "5",
              "--arm", "nope"]
    )  # fmt: skip
    assert bad.exit_code == 2


def test_open_loop_and_time_limit() -> None:
    server = FakeServer(delay=0.05)
    cfg = SweepConfig(levels=[50.0], mode="open", open_tasks=4, seed=1)
    res = run(server, cfg)
    s = res.levels[0].summary
    assert s.mode == "open" and s.steps == 12 and res.plan is None
    slow = FakeServer(delay=0.2)
    cfg = SweepConfig(levels=[2], tasks_per_agent=5, max_level_s=0.5)
    res = run(slow, cfg)
    lv = res.levels[0]
    assert "time limit" in (lv.summary.stop_reason or "")
    assert any(t.outcome == "stopped" for t in lv.tasks)
    assert lv.wall_s < 2.0


def test_saturation_cap_stops_the_sweep() -> None:
    server = FakeServer(delay=0.05)
    cfg = SweepConfig(levels=[1, 2, 4], tasks_per_agent=1, saturation_cap_s=0.01)
    res = run(server, cfg)
    assert [lv.summary.level for lv in res.levels] == [1]
    assert res.levels[0].summary.saturated and "sweep stopped" in res.notes[0]
