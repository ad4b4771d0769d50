"""``loopstack agent run --team FILE --plan MODE --json``: the README's example team through
the CLI, with a scripted model behind the real client (plan, workers and cost in the JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from loopstack.agent import cli
from loopstack.agent.exceptions import ConfigError
from loopstack.agent.observe.trace import show_trace
from loopstack.agent.run.team import load_team
from loopstack.agent.scripted import Reply, ScriptedModel, call, text

TEAM = Path(__file__).resolve().parents[3] / "examples" / "team" / "team.yaml"


def tool_names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools", [])}


def script(body: dict[str, Any]) -> Reply:
    """Coordinator: sales, then calc, then answer. Workers: their tool, then answer."""
    names = tool_names(body)
    seen = [m for m in body["messages"] if m["role"] == "tool"]
    if "sales" in names:  # the coordinator
        if not seen:
            return call("sales", task="Revenue per region in 2025-03")
        if len(seen) == 1:
            return call("calc", task="7300 / 44600 * 100")
        return text("West, 16.37 percent")
    if "sales_by_region" in names:
        return call("sales_by_region", month="2025-03") if not seen else text("West 7300")
    return call("calculate", expression="7300 / 44600 * 100") if not seen else text("16.37")


def test_team_file_through_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = {"multi_step": True, "steps": [{"goal": "get revenue"}, {"goal": "compute share"}]}
    model = ScriptedModel(
        [script], answer="West had the lowest revenue: 16.37 percent", plans=[plan]
    )
    monkeypatch.setattr(cli, "AsyncOpenAI", lambda **kw: model.client())
    goal = "Which region sold least in 2025-03, and its share of the total in percent?"
    res = CliRunner().invoke(
        cli.app,
        ["run", goal, "--team", str(TEAM), "--plan", "always", "--json", "--no-memory"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "done" and "16.37" in out["answer"]
    assert [w["name"] for w in out["workers"]] == ["sales", "calc"]
    assert all(w["status"] == "done" and w["steps"] >= 2 for w in out["workers"])
    assert [p["status"] for p in out["plan"]] == ["done", "done"]
    cost = out["cost"]
    worker_calls = sum(w["cost"]["model_calls"] for w in out["workers"])
    assert cost["model_calls"] == len(model.requests) and worker_calls >= 4
    assert cost["tool_calls"] == 2 + 2  # two worker calls, one tool call inside each
    assert set(out) >= {"status", "answer", "steps", "tool_calls", "trace_path"}
    # the coordinator's prompt carried the team instructions and the file's own
    first = next(r for r in model.chat_requests if "sales" in tool_names(r))
    assert "sales worker for the figures first" in first["messages"][0]["content"]
    # and the rule that a request of several parts gets a worker call for each part (small
    # coordinators answered after the first worker: docs/results/models-2026-12-05/NOTES.md)
    assert "call the worker for the next part" in first["messages"][0]["content"]
    console = Console(record=True, width=240)
    show_trace(out["run_id"], console=console)
    assert console.export_text().count("worker run ") == 2


def test_bad_team_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "team.yaml"
    bad.write_text("workers:\n  - name: a\n    description: x\n    max_stepz: 3\n")
    with pytest.raises(ConfigError, match="max_stepz"):
        load_team(bad)
    bad.write_text("workers:\n  - {name: a, description: x}\n  - {name: a, description: y}\n")
    with pytest.raises(ConfigError, match="unique"):
        load_team(bad)
    bad.write_text("workers: []\n")
    with pytest.raises(ConfigError):
        load_team(bad)
    assert load_team(TEAM).workers[0].limit_overrides() == {"max_steps": 4, "max_tool_calls": 4}
