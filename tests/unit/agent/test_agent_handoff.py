"""Runs end honestly: an exit code per status, and the hand-off of an unfinished run to a
command (summary JSON on stdin) or a webhook on this machine (loopstack.agent.observe.handoff)."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loopstack.agent import cli
from loopstack.agent.exceptions import ConfigError
from loopstack.agent.observe.handoff import EXIT_CODES, Handoff, exit_code, local_url
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


def looping_model() -> ScriptedModel:
    n = iter(range(100))
    return ScriptedModel([lambda b: call("get_weather", city=f"c{next(n)}")])


def test_exit_code_table() -> None:
    assert EXIT_CODES == {"done": 0, "max_steps": 3, "budget": 4, "error": 5, "refused": 6}
    assert exit_code("something new") == 5
    assert len(set(EXIT_CODES.values()) | {2}) == 6  # each status tells itself apart


def test_a_run_stopped_by_a_limit_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    args = ["loop", "--tools", str(f), "--json", "--no-memory", "--max-steps", "2"]
    res = run_cli(monkeypatch, looping_model(), *args)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "max_steps" and res.exit_code == 3
    budget = run_cli(monkeypatch, looping_model(), *args[:-2], "--max-tokens", "150")
    assert json.loads(budget.stdout.strip().splitlines()[-1])["status"] == "budget"
    assert budget.exit_code == 4
    done = run_cli(
        monkeypatch,
        ScriptedModel([call("get_weather", city="Paris")], answer="18 C"),
        "Weather?",
        "--tools",
        str(f),
        "--json",
        "--no-memory",
    )
    assert done.exit_code == 0


def test_on_unfinished_gets_the_summary_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    got = tmp_path / "handed.json"
    hook = f"{sys.executable} -c \"import sys; open('{got}', 'w').write(sys.stdin.read())\""
    args = ["loop", "--tools", str(f), "--no-memory", "--max-steps", "2", "--on-unfinished", hook]
    res = run_cli(monkeypatch, looping_model(), *args)
    assert res.exit_code == 3
    summary = json.loads(got.read_text())
    assert summary["goal"] == "loop" and summary["status"] == "max_steps"
    assert summary["trace_path"] and summary["tool_calls"]
    got.unlink()
    res = run_cli(
        monkeypatch,
        ScriptedModel([call("get_weather", city="Paris")], answer="18 C"),
        "Weather?",
        "--tools",
        str(f),
        "--no-memory",
        "--on-unfinished",
        hook,
    )
    assert res.exit_code == 0 and not got.exists()  # a finished run is not handed off


def test_the_webhook_must_be_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for ok in ("http://127.0.0.1:9/h", "http://localhost/x", "https://[::1]:8/h"):
        assert local_url(ok) == ok
    for bad in ("http://example.com/h", "http://10.0.0.1/h", "ftp://127.0.0.1/x", "nope"):
        with pytest.raises(ConfigError):
            local_url(bad)
    f = tmp_path / "tools.py"
    f.write_text(TOOLS)
    res = run_cli(
        monkeypatch,
        looping_model(),
        "loop",
        "--tools",
        str(f),
        "--no-memory",
        "--handoff-url",
        "http://example.com/hook",
    )
    assert res.exit_code == 2 and "only localhost" in res.output


async def test_the_webhook_receives_the_summary_and_failures_are_reported() -> None:
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        summary = {"goal": "g", "status": "budget", "reason": "tokens", "answer": "partial"}
        assert await Handoff(url=url)(summary) == []
        assert received == [summary]
        assert await Handoff(url=url)({"status": "done"}) == [] and len(received) == 1
    finally:
        server.shutdown()
        server.server_close()
    problems = await Handoff(command="false", url=url)({"status": "error"})
    assert len(problems) == 2 and "exited 1" in problems[0]
    with pytest.raises(ConfigError):
        Handoff(command="   ")


def test_every_status_has_its_own_exit_code() -> None:
    """A status added to `loopstack.agent.core.state.Status` must get a code (it would otherwise
    exit 5)."""
    import typing

    from loopstack.agent.core.state import Status

    assert set(typing.get_args(Status)) == set(EXIT_CODES)
