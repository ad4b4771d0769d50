"""`loopstack agent run --json` contract with a scripted model behind the real client."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loopstack.agent import cli
from loopstack.agent.observe.trace import load_trace, show_trace
from loopstack.agent.scripted import ScriptedModel, call

TOOLS = textwrap.dedent(
    '''
    def get_weather(city: str) -> dict:
        """Current weather.

        Args:
            city: City name.
        """
        return {"city": city, "temperature_c": 18}
    '''
)


def run_cli(monkeypatch: pytest.MonkeyPatch, model: ScriptedModel, *args: str) -> Any:
    monkeypatch.setattr(cli, "AsyncOpenAI", lambda **kw: model.client())
    return CliRunner().invoke(cli.app, ["run", *args])


def test_run_json_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    model = ScriptedModel([call("get_weather", city="Paris")], answer="18 C in Paris")
    res = run_cli(
        monkeypatch, model, "Weather in Paris?", "--tools", str(f), "--json", "--no-memory"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "done" and out["answer"] == "18 C in Paris"
    assert out["steps"] == 3  # call, the repeat answered with a hint, the repeat again
    assert out["tool_calls"] == [
        {"name": "get_weather", "arguments": {"city": "Paris"}, "status": "ok"}
    ]
    assert Path(out["trace_path"]).is_file()
    assert model.requests[0]["model"] == "scripted-model"  # the embedding model is skipped
    lines = load_trace(out["run_id"])
    assert [x["type"] for x in lines] == [
        "start",
        "model",
        "tool",
        "model",
        "tool",
        "model",
        "final",
    ]
    assert lines[0]["input"] == "Weather in Paris?" and lines[0]["memory"] == "off"
    show_trace(out["run_id"])


def test_run_prints_each_step_as_it_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --json: calls and results on stderr while the run goes, the answer on stdout,
    a one-line account last; the same run as the JSON contract above."""
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    model = ScriptedModel([call("get_weather", city="Paris")], answer="18 C in Paris")
    res = run_cli(monkeypatch, model, "Weather in Paris?", "--tools", str(f), "--no-memory")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "18 C in Paris"
    err = res.stderr.splitlines()
    assert err[0] == '-> get_weather({"city": "Paris"})'
    assert err[1].startswith("<- get_weather: ok: ") and '"temperature_c": 18' in err[1]
    assert err[-1].startswith("[done (") and "3 steps" in err[-1] and "trace: " in err[-1]


def test_run_json_limit_and_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    n = iter(range(100))
    model = ScriptedModel([lambda b: call("get_weather", city=f"c{next(n)}")])
    res = run_cli(
        monkeypatch, model, "loop", "--tools", str(f), "--json", "--no-memory", "--max-steps", "2"
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out["status"], out["reason"], out["steps"]) == ("max_steps", "max_steps", 2)
    bad = run_cli(monkeypatch, model, "x", "--tools", str(tmp_path / "nope.py"), "--json")
    assert bad.exit_code == 2
    err = json.loads(bad.stdout.strip().splitlines()[-1])
    assert err["status"] == "error" and "not found" in err["error"]


def test_endpoint_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopstack.agent.core.settings import resolve_base_url

    assert resolve_base_url() == "http://127.0.0.1:8000/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://o/v1")
    assert resolve_base_url() == "http://o/v1"
    monkeypatch.setenv("LOOPSTACK_BASE_URL", "http://l/v1/")
    assert resolve_base_url() == "http://l/v1"
    assert resolve_base_url("http://x/v1") == "http://x/v1"


def test_chat_streams_answers_and_keeps_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    model = ScriptedModel(
        [call("get_weather", city="Paris")], answer=lambda body: 'It is 18 "C" in Paris.'
    )
    monkeypatch.setattr(cli, "AsyncOpenAI", lambda **kw: model.client())
    res = CliRunner().invoke(
        cli.app,
        ["chat", "--tools", str(f), "--no-memory"],
        input="Weather in Paris?\nAnd tomorrow?\n\n",
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.count('It is 18 "C" in Paris.') == 2  # streamed, decoded
    finals = [r for r in model.requests if r.get("response_format")]
    assert all(r["stream"] for r in finals)
    # the second turn sees the first turn's history
    second = model.chat_requests[-1]["messages"]
    assert [m["content"] for m in second if m["role"] == "user"] == [
        "Weather in Paris?",
        "And tomorrow?",
    ]


def test_run_with_memory_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSTACK_MEMORY_EMBEDDER", "hashing")
    monkeypatch.setenv("LOOPSTACK_MEMORY_THRESHOLD", "0.2")
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    first = ScriptedModel([call("get_weather", city="Oslo")], answer="Noted.")
    res = run_cli(
        monkeypatch,
        first,
        "Remember that my locker code is 4417.",
        "--tools",
        str(f),
        "--user",
        "ana",
        "--json",
        "--memory-tools",
    )
    assert res.exit_code == 0, res.output
    offered = {t["function"]["name"] for t in first.chat_requests[0]["tools"]}
    assert offered == {"get_weather", "recall_memory", "save_memory"}
    second = ScriptedModel([call("get_weather", city="Oslo")], answer="4417")
    run_cli(
        monkeypatch, second, "What is my locker code?", "--tools", str(f), "--user", "ana", "--json"
    )
    assert "4417" in second.requests[0]["messages"][0]["content"]
    assert len(second.chat_requests[0]["tools"]) == 1
    other = ScriptedModel([call("get_weather", city="Oslo")], answer="?")
    run_cli(
        monkeypatch, other, "What is my locker code?", "--tools", str(f), "--user", "bob", "--json"
    )
    assert "4417" not in other.requests[0]["messages"][0]["content"]
