"""The agent loop's own cost, with an instant scripted model and instant tools.

    loopstack bench agent overhead [--steps 50] [--measure 20]

1. Per-step overhead at ``--steps`` steps of history: the loop runs ``steps + measure``
   steps against `loopstack.agent.scripted.ScriptedModel` (an ``httpx`` MockTransport under the real
   ``openai`` client) and an instant tool; each step after the first ``steps`` is timed
   (model request + tool call + bookkeeping + trace line), in wall time and in this
   process's CPU time (the machine may be shared: CPU time is what the loop costs). The
   baseline is one bare ``chat.completions.create`` with the same history through the same
   client and fake server: the loop's own overhead is the difference. Target: < 5 ms per
   step, model request included.
2. Wall time of one step with 3 independent 1-second tools (sync ``time.sleep``, run in
   worker threads). Target: < 1.2 s.
3. Planning and team bookkeeping (loopstack.agent.run.plan, loopstack.agent.run.team): the same
   per-step CPU with a
   6-step plan in the run state (``--plan always``: the plan block in every prompt; the
   measured steps come after its 6 steps are done, so advancing it is the cheap path), and
   with every step handing a sub-task to an instant worker agent (a fresh agent, its trace,
   budget carving, charging); the worker's own model request is subtracted (one bare
   request). Target: < 5 ms more than the plain loop.

Prints JSON lines and a final ``RESULT {...}`` line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from loopstack.agent.core.settings import AgentConfig, Limits, PlanMode
from loopstack.agent.core.state import ModelStep, ToolStep
from loopstack.agent.run.loop import Agent
from loopstack.agent.run.team import Worker, worker_tools
from loopstack.agent.scripted import ScriptedModel, call, calls, text
from loopstack.agent.tools.registry import ToolRegistry
from loopstack.bench.commandline import benchmark_app, run_command


def lookup(key: str) -> dict[str, Any]:
    """Instant lookup.

    Args:
        key: what to look up
    """
    return {"key": key, "value": len(key), "note": "instant"}


def wait_one_second(label: str) -> str:
    """Sleeps one second (blocking), like a slow API call.

    Args:
        label: any label
    """
    time.sleep(1.0)
    return label


PLAN = {"multi_step": True, "steps": [{"goal": f"look up key {i}"} for i in range(6)]}


async def per_step(
    history: int, measure: int, trace_dir: Path, mode: str = "plain"
) -> dict[str, Any]:
    n = iter(range(10**6))
    tool = "helper" if mode == "team" else "lookup"
    arg = "task" if mode == "team" else "key"
    model = ScriptedModel(
        [lambda body: call(tool, **{arg: f"k{next(n)}"})], answer="done", plans=[PLAN]
    )
    limits = Limits(
        max_steps=history + measure + 1,
        max_tool_calls=10**6,
        max_tokens=10**9,
        context_tokens=10**9,
        no_progress_steps=10**6,
    )
    registry = ToolRegistry([lookup])
    if mode == "team":  # an instant worker: one model request, answered in text
        helper = ScriptedModel([text("42")])
        limits_w = Limits(max_tokens=10**9, max_tool_calls=10**6)
        worker = Worker(
            "helper", "answers", ToolRegistry(), limits=limits_w, client=helper.client()
        )
        registry.add_all(worker_tools([worker]), group="workers")
    plan: PlanMode = "always" if mode == "plan" else "never"
    config = AgentConfig(limits=limits, plan=plan, trace_dir=trace_dir)
    agent = Agent(model.client(), "scripted-model", registry, config)
    marks: list[tuple[float, float]] = []
    async for step in agent.steps("look up many keys"):
        if isinstance(step, ModelStep):
            marks.append((time.perf_counter(), time.process_time()))
    pairs = list(itertools.pairwise(marks))[history - 1 : history - 1 + measure]
    wall = [(b[0] - a[0]) * 1e3 for a, b in pairs]
    cpu = [(b[1] - a[1]) * 1e3 for a, b in pairs]
    # baselines: the same request (history included) through the same client + fake server,
    # sent as the loop sends it (plain JSON) and through the client's typed path
    body = model.chat_requests[history]
    client = model.client()

    async def bare(typed: bool) -> tuple[float, float]:
        kw: dict[str, Any] = {"messages": body["messages"], "tools": body["tools"]}
        if not typed:
            kw = {"messages": [], "extra_body": kw}
        t0, c0 = time.perf_counter(), time.process_time()
        await client.chat.completions.create(
            model=body["model"], tool_choice="auto", max_tokens=body["max_tokens"], **kw
        )
        return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3

    plain = [await bare(False) for _ in range(measure)]
    typed = [await bare(True) for _ in range(measure)]

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 3)

    return {
        "mode": mode,
        "history_steps": history,
        "messages_in_history": len(body["messages"]),
        "step_wall_ms_p50": med(wall),
        "step_cpu_ms_p50": med(cpu),
        "bare_request_wall_ms_p50": med([w for w, _ in plain]),
        "bare_request_cpu_ms_p50": med([c for _, c in plain]),
        "typed_request_cpu_ms_p50": med([c for _, c in typed]),
        "loop_overhead_cpu_ms_p50": round(med(cpu) - med([c for _, c in plain]), 3),
    }


async def parallel_tools(trace_dir: Path) -> dict[str, Any]:
    model = ScriptedModel(
        [
            calls(
                ("wait_one_second", {"label": "a"}),
                ("wait_one_second", {"label": "b"}),
                ("wait_one_second", {"label": "c"}),
            ),
            text("done"),
        ]
    )
    config = AgentConfig(trace_dir=trace_dir)
    agent = Agent(model.client(), "scripted-model", ToolRegistry([wait_one_second]), config)
    t_model = t_last = 0.0
    async for step in agent.steps("three slow calls"):
        if isinstance(step, ModelStep) and step.step == 1:
            t_model = time.perf_counter()
        elif isinstance(step, ToolStep):
            t_last = time.perf_counter()
    return {"tools": 3, "each_s": 1.0, "step_wall_s": round(t_last - t_model, 3)}


async def main_async(args: SimpleNamespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        a = await per_step(args.steps, args.measure, Path(d))
        print(json.dumps({"bench": "per_step", **a}), flush=True)
        b = await parallel_tools(Path(d))
        print(json.dumps({"bench": "parallel_tools", **b}), flush=True)
        planned = await per_step(args.steps, args.measure, Path(d), "plan")
        print(json.dumps({"bench": "per_step", **planned}), flush=True)
        team = await per_step(args.steps, args.measure, Path(d), "team")
        print(json.dumps({"bench": "per_step", **team}), flush=True)
    plan_ms = round(planned["step_cpu_ms_p50"] - a["step_cpu_ms_p50"], 3)
    # a team step also makes the worker's model request: subtract one bare request
    team_ms = round(
        team["step_cpu_ms_p50"] - a["step_cpu_ms_p50"] - a["bare_request_cpu_ms_p50"], 3
    )
    return {
        "plan_bookkeeping_cpu_ms_per_step": plan_ms,
        "team_bookkeeping_cpu_ms_per_step": team_ms,
        "history_steps": a["history_steps"],
        "step_cpu_ms_p50": a["step_cpu_ms_p50"],
        "step_wall_ms_p50": a["step_wall_ms_p50"],
        "loop_overhead_cpu_ms_p50": a["loop_overhead_cpu_ms_p50"],
        "three_1s_tools_wall_s": b["step_wall_s"],
        "targets": {"step_ms": 5.0, "three_tools_s": 1.2, "plan_team_ms": 5.0},
        "ok": a["loop_overhead_cpu_ms_p50"] < 5.0
        and b["step_wall_s"] < 1.2
        and plan_ms < 5.0
        and team_ms < 5.0,
    }


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def overhead(
    steps: int = typer.Option(50, help="steps of history before measuring"),
    measure: int = typer.Option(20, help="steps measured"),
) -> int:
    result = asyncio.run(main_async(SimpleNamespace(steps=steps, measure=measure)))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
