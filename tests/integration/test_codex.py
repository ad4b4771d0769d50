"""Codex CLI (pinned in requirements/npm-clients.txt, `make npm-clients`) against our
/v1/responses, as a user configures it: a `model_providers` entry with `wire_api =
"responses"` and `model_catalog_url` pointing at our GET /v1/models (Codex's catalogue
shape: `apply_patch` as a free-form tool), plugins, apps, multi-agent, goals and web search
off, a temporary HOME and CODEX_HOME, `codex exec --json` on one small task.

Twice: against the real server process over a scripted engine that answers with a function
call (`exec_command`), then an `apply_patch` custom call, then text - proven: Codex parses our
events, runs both tools (the file is really written), sends their output back, and we parse
that (the outputs are in the next prompt); and against the real server and model, where
only the protocol is asserted (Codex connected, read every event, ended its turn) and what
the model did is reported (bench/results/clients/codex-real.json)."""

from __future__ import annotations

import fcntl
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopstack.bench.clients.setup import codex_argv, codex_env, codex_home
from tests.clients.scripted_server import Launched
from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "bench" / "results" / "clients"
KEY = "scripted-key"
PATCH = "*** Begin Patch\n*** Add File: greeting.txt\n+hello from loopstack\n*** End Patch"
TURNS = [
    json.dumps({"name": "exec_command", "arguments": {"cmd": "cat hello.txt"}}),
    json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}),
    "Done: I read hello.txt and added greeting.txt.",
]


@pytest.fixture(scope="module")
def codex() -> Path:
    """The pinned Codex binary. `make test` installs it in the background, holding
    .npm-clients.lock; this waits for that lock, then runs `make npm-clients` (nothing left
    to do then; it installs when pytest runs alone)."""
    with (ROOT / ".npm-clients.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = subprocess.run(["make", "-s", "npm-clients"], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, f"make npm-clients failed:\n{made.stdout}\n{made.stderr}"
    return ROOT / ".npm-clients" / "bin" / "codex"


def run_codex(
    codex: Path,
    folder: Path,
    base_url: str,
    key: str,
    model: str,
    task: str,
    budget_s: float = 300.0,
) -> dict[str, Any]:
    """`codex exec --json` in a fresh repository with hello.txt; its events, exit code, the
    files it left."""
    home, repo = folder / "home", folder / "repo"
    repo.mkdir()
    (repo / "hello.txt").write_text("hello world\n")
    codex_home(home, base_url, model)
    env, argv = codex_env(home, key), codex_argv(codex, repo, model, task)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:  # a model that never stops calling tools
        proc.kill()
        out, err = proc.communicate()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    files = {p.name: p.read_text() for p in repo.iterdir() if p.is_file()}
    return {"rc": proc.returncode, "events": events, "files": files, "stderr": err[-2000:],
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def items(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["item"] for e in run["events"]
            if e.get("type") == "item.completed" and e["item"].get("type") == kind]  # fmt: skip


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    with Launched({"turns": TURNS}, tmp_path_factory.mktemp("codex-engine"), api_key=KEY) as s:
        yield s


def test_codex_runs_a_function_call_and_an_apply_patch_custom_call(
    codex: Path, scripted: Launched, tmp_path: Path
) -> None:
    run = run_codex(codex, tmp_path, scripted.base_url, KEY, "scripted",
                    "Show hello.txt, then add greeting.txt")  # fmt: skip
    assert run["rc"] == 0, run["stderr"]
    kinds = [e["type"] for e in run["events"]]
    assert kinds[-1] == "turn.completed", kinds
    assert not items(run, "error"), items(run, "error")  # e.g. "Model metadata ... not found"
    [command] = items(run, "command_execution")
    assert "cat hello.txt" in command["command"] and command["exit_code"] == 0
    assert command["aggregated_output"] == "hello world\n"
    [change] = items(run, "file_change")
    assert change["status"] == "completed" and change["changes"][0]["kind"] == "add"
    assert run["files"]["greeting.txt"] == "hello from loopstack\n"  # Codex applied our patch
    assert items(run, "agent_message")[-1]["text"] == TURNS[-1]
    # Codex offered apply_patch as a custom tool (the catalogue asked for it) and sent both
    # tools' outputs back; we parsed them into the next prompts
    prompts = [str(r["body"].get("prompt", "")) for r in scripted.requests()]
    assert '"name": "apply_patch"' in prompts[0] and '"input": {"type": "string"}' in prompts[0]
    assert "hello world" in prompts[1] and "<tool_call>" in prompts[1]
    assert "Success. Updated the following files" in prompts[2]
    assert run["events"][-1]["usage"]["input_tokens"] > 0


REAL_BUDGET_S = 240.0  # the 0.5B may call tools turn after turn: what it did by then counts


def test_codex_real_model_reported(codex: Path, server: Server, tmp_path: Path) -> None:
    """The real model: Codex must connect and read every event (no stream error, at least
    one answer parsed); whether the model ran a tool, wrote the file or finished within
    the budget is reported."""
    run = run_codex(codex, tmp_path, server.base_url + "/v1", API_KEY, server.model,
                    "Create a file greeting.txt containing the word hello.",
                    budget_s=REAL_BUDGET_S)  # fmt: skip
    done = [e["item"] for e in run["events"] if e.get("type") == "item.completed"]
    report = {
        "model": server.model,
        "codex": "0.169.0",
        "rc": run["rc"],
        "finished": any(e["type"] == "turn.completed" for e in run["events"]),
        "seconds": run["seconds"],
        "events": [e["type"] for e in run["events"]],
        "commands": [i.get("command") for i in items(run, "command_execution")],
        "file_changes": [i.get("changes") for i in items(run, "file_change")],
        "messages": [i.get("text", "")[:500] for i in items(run, "agent_message")],
        "errors": [i.get("message") for i in items(run, "error")],
        "failed": [e for e in run["events"] if e["type"] in ("turn.failed", "error")],
        "wrote_greeting": "greeting.txt" in run["files"],
        "usage": next((e.get("usage") for e in run["events"] if e["type"] == "turn.completed"),
                      None),
    }  # fmt: skip
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "codex-real.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    assert not report["failed"] and not report["errors"], (report, run["stderr"])
    # Parsed: every event read and the turn completed, or an answer item at least. What the
    # model makes of it is reported: with the server's selection defaults on Responses too
    # (2026-12-07), the 0.5B's turn here can end after a call Codex handles itself (no item).
    assert report["finished"] or any(i.get("type") != "error" for i in done), report
    if report["finished"]:
        assert run["rc"] == 0, run["stderr"]
