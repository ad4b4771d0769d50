"""A team with a plan, through the CLI, against the real model: the --json contract (plan,
workers, cost), the cost summed over the team from every request the traces record, and
the trace tree (each worker's lines point at the coordinator's call)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopstack.agent.observe.handoff import exit_code
from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "team"


async def test_a_team_through_the_cli_and_from_python(server: Server, tmp_path: Path) -> None:
    """Both runs at once: they share the engine's batches (one after the other they took
    169 s and 413 s on a loaded machine)."""
    await asyncio.gather(
        asyncio.to_thread(cli_team_with_a_plan, server, tmp_path / "cli"),
        python_team_counts_every_request(server, tmp_path / "py"),
    )


def cli_team_with_a_plan(server: Server, tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    team = tmp_path / "team.yaml"  # the README's example team, with tighter step limits
    team.write_text(
        (EXAMPLE / "team.yaml")
        .read_text()
        .replace("tools: sales_tools.py", f"tools: {EXAMPLE / 'sales_tools.py'}")
        .replace("tools: calc_tools.py", f"tools: {EXAMPLE / 'calc_tools.py'}")
        .replace("max_steps: 4", "max_steps: 2")
        .replace("max_steps: 3", "max_steps: 2")
    )
    home = tmp_path / "home"
    env = {**os.environ, "LOOPSTACK_API_KEY": API_KEY, "LOOPSTACK_HOME": str(home)}
    goal = "What was the revenue of the West region in 2025-03? Ask the sales worker."
    cmd = [sys.executable, "-m", "loopstack", "agent", "run", goal, "--team", str(team)]
    cmd += ["--plan", "always", "--max-steps", "2", "--no-memory", "--timeout", "400"]
    cmd += ["--base-url", server.base_url + "/v1", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    # the process exits with its status's code (0 only for done: loopstack.agent.observe.handoff)
    assert proc.returncode == exit_code(out["status"]), proc.stderr[-2000:]
    assert out["status"] in ("done", "max_steps", "budget") and isinstance(out["answer"], str)
    # the plan request went through our server's response_format constraint
    assert isinstance(out["plan"], list) and out["plan"], out
    assert all(p["status"] in ("done", "failed", "skipped") for p in out["plan"])
    # the cost is every request of the team: the coordinator's trace and its workers'
    traces = [Path(out["trace_path"])]
    traces += [home / "traces" / f"{w['run_id']}.jsonl" for w in out["workers"]]
    lines = [json.loads(x) for t in traces for x in t.read_text().splitlines()]
    requests = [x for x in lines if x["type"] in ("model", "plan")] + [
        x for x in lines if x["type"] == "final" and x.get("prompt_tokens")
    ]
    cost = out["cost"]
    assert cost["model_calls"] >= len(requests) >= 2
    assert cost["prompt_tokens"] >= sum(x.get("prompt_tokens", 0) for x in requests) > 0
    assert 0 <= cost["cached_prompt_tokens"] <= cost["prompt_tokens"]
    for w in out["workers"]:
        assert w["name"] in ("sales", "calc") and set(w["cost"]) == set(cost)
        child = [json.loads(x) for x in (home / "traces" / f"{w['run_id']}.jsonl").open()]
        assert {x["parent_run_id"] for x in child} == {out["run_id"]}


async def python_team_counts_every_request(server: Server, tmp_path: Path) -> None:
    await asyncio.to_thread(tmp_path.mkdir, parents=True, exist_ok=True)
    from openai import AsyncOpenAI

    from loopstack.agent.core.settings import AgentConfig, Limits
    from loopstack.agent.run.loop import Agent
    from loopstack.agent.run.team import Worker, worker_tools
    from loopstack.agent.tools.registry import ToolRegistry, load_tools_file

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
    sales = Worker(
        "sales",
        "Answers questions about monthly sales per region.",
        ToolRegistry(load_tools_file(EXAMPLE / "sales_tools.py")),
        limits=Limits(max_steps=2),
    )
    tools = ToolRegistry()
    tools.add_all(worker_tools([sales]), group="workers")
    config = AgentConfig(Limits(max_steps=2, wall_clock_s=400), trace_dir=tmp_path, plan="always")
    agent = Agent(client, server.model, tools, config)
    result = await agent.run("Ask the sales worker for the revenue of the West region in 2025-03.")
    assert result.plan is not None and result.status in ("done", "max_steps", "budget")
    own = [s for s in result.history if getattr(s, "prompt_tokens", 0)]
    workers = sum(w["cost"]["model_calls"] for w in result.workers)
    assert result.cost.model_calls == len(own) + workers
    await client.close()
