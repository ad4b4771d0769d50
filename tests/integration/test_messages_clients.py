"""The Anthropic Messages API under its real clients: the anthropic SDK (from .venv-clients,
`make clients`) and Claude Code (the pinned npm package, `make npm-clients`), each against

* the real `loopstack serve` process over a scripted engine that answers with a tool call
  (tests/clients/scripted_engine.py, as ``LOOPSTACK_ENGINE_URL``): the whole call path - the
  client parsing our events, running its tool, sending the result back, our parsing that -
  is asserted every time;
* the session's real server and model: each client must connect, parse every event and exit
  cleanly; whether the model calls and finishes is printed (and reported in
  docs/benchmarks.md), not asserted.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from loopstack.bench.clients.setup import claude_argv, claude_env
from loopstack.serving.config import OFFLINE_SMALL
from tests.integration.conftest import API_KEY, Server, stop, wait_healthy
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SDK_SCRIPT = ROOT / "tests" / "clients" / "anthropic_client.py"
NPM = ROOT / ".npm-clients"
CLAUDE = NPM / "bin" / "claude"
SCRIPTED = "scripted"
SECRET = "The secret word is MARMALADE-42."


def _locked_make(target: str, lock: Path) -> None:
    """`make TARGET` under the lock `make test` holds while it makes the same thing."""
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        made = subprocess.run(
            ["make", "-s", target], cwd=ROOT, capture_output=True, text=True, timeout=900
        )
    assert made.returncode == 0, f"make {target} failed:\n{made.stdout}\n{made.stderr}"


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    _locked_make("clients", ROOT / ".venv-clients.lock")
    return ROOT / ".venv-clients" / "bin" / "python"


@pytest.fixture(scope="module")
def claude() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("no npm on this machine: Claude Code cannot be installed")
    _locked_make("npm-clients", ROOT / ".npm-clients.lock")
    return CLAUDE


@pytest.fixture(scope="module")
def project() -> Iterator[Path]:
    """A directory for Claude Code to work in, with the file its task reads."""
    path = Path(tempfile.mkdtemp(prefix="loopstack-claude-"))
    (path / "project").mkdir()
    (path / "home").mkdir()
    (path / "project" / "note.txt").write_text(SECRET + "\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def scripted_server(project: Path) -> Iterator[str]:
    """The real `loopstack serve` over the scripted engine; its base URL."""
    port, engine_port = free_port(), free_port()
    calls = {"get_weather": {"city": "Paris"},
             "Read": {"file_path": str(project / "project" / "note.txt")}}  # fmt: skip
    env = {**os.environ, "SCRIPTED_CALLS": json.dumps(calls), "PYTHONPATH": str(ROOT)}
    log_dir = Path(tempfile.mkdtemp(prefix="loopstack-scripted-"))
    engine = subprocess.Popen(
        [sys.executable, "-m", "tests.clients.scripted_engine", "--port", str(engine_port),
         "--served-model-name", SCRIPTED],
        env=env, cwd=ROOT, stdout=(log_dir / "engine.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    serve_env = {
        **env,
        "HF_HUB_OFFLINE": "1",
        "LOOPSTACK_PORT": str(port),
        "LOOPSTACK_ENGINE_URL": f"http://127.0.0.1:{engine_port}",
        "LOOPSTACK_SERVED_MODEL_NAME": SCRIPTED,
        "LOOPSTACK_API_KEY": API_KEY,
        "LOOPSTACK_MODEL_ALIASES": "claude-*",  # Claude Code's background model names
    }
    serve_env.setdefault("LOOPSTACK_MODEL", OFFLINE_SMALL)  # its tokenizer renders prompts
    log = log_dir / "server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "loopstack", "serve"], env=serve_env, cwd=ROOT,
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, log, 600)
        yield url
    finally:
        stop(server)
        stop(engine)
        shutil.rmtree(log_dir, ignore_errors=True)


def run_sdk(python: Path, base_url: str, model: str, *cases: str) -> dict[str, Any]:
    env = {**os.environ, "ANTHROPIC_BASE_URL": base_url, "LOOPSTACK_TEST_KEY": API_KEY}
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    done = subprocess.run(
        [str(python), str(SDK_SCRIPT), model, *cases], env=env, capture_output=True, text=True,
        timeout=800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def run_claude(
    claude: Path, base_url: str, model: str, project: Path, task: str, *extra: str
) -> dict[str, Any]:
    env = claude_env(project / "home", base_url, API_KEY, model)
    argv = claude_argv(claude, task, *extra)
    done = subprocess.run(
        argv, env=env, cwd=project / "project", capture_output=True, text=True, timeout=800,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.stdout.strip(), f"claude printed nothing (rc {done.returncode}):\n{done.stderr}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["returncode"] = done.returncode
    return dict(result)


# --------------------------------------------------------------------------- scripted engine
def test_anthropic_sdk_against_the_scripted_engine(sdk_python: Path, scripted_server: str) -> None:
    out = run_sdk(sdk_python, scripted_server, SCRIPTED)
    cases = out["cases"]
    failed = {k: v["error"] for k, v in cases.items() if not v["ok"]}
    assert not failed, failed
    for name in ("create", "bearer", "stream", "tool-none"):
        assert cases[name]["content"][0]["type"] == "text", cases[name]
        assert cases[name]["stop_reason"] == "end_turn"
    events = cases["stream"]["events"]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    for name in ("tool-auto", "tool-any", "tool-named", "tool-any-stream"):
        [use] = cases[name]["content"]
        assert use["type"] == "tool_use" and use["name"] == "get_weather", cases[name]
        assert use["input"] == {"city": "Paris"}
        assert cases[name]["stop_reason"] == "tool_use"
    assert "input_json" in cases["tool-any-stream"]["events"]  # the SDK's parsed deltas
    second = cases["round-trip"]["second"]
    assert "code 7731" in second["content"][0]["text"]  # the tool result reached the model
    counts = cases["count-tokens"]
    assert 0 < counts["short"] < counts["with_tools"]
    assert cases["unknown-model"] == {"ok": True, "status": 404, "type": "not_found_error"}


def test_claude_code_against_the_scripted_engine(
    claude: Path, scripted_server: str, project: Path
) -> None:
    """Claude Code's own ~19k-token prompt and 20-odd tools, max_tokens 32000 (lowered to
    fit), role-system entries, attribution line, streaming: a Read round trip."""
    result = run_claude(
        claude, scripted_server, SCRIPTED, project, "Read note.txt and tell me the secret word."
    )
    assert result["returncode"] == 0 and result["is_error"] is False, result
    assert result["num_turns"] >= 2, result  # the tool ran and its result came back
    assert "MARMALADE-42" in result["result"], result


# --------------------------------------------------------------------------- real model
# The cases that cover the protocol on a CPU within the test-time budget (each generation of
# the 0.5B takes seconds here); the scripted run above covers every case.
REAL_MODEL_CASES = ("stream", "tool-any-stream", "round-trip", "count-tokens")


@pytest.fixture(scope="module")
def real_runs(
    sdk_python: Path, server: Server, project: Path, request: pytest.FixtureRequest
) -> dict[str, Future[dict[str, Any]]]:
    """The SDK's cases and Claude Code's task against the real model at once (the engine
    batches them; one after the other they took ~37 s of the integration run)."""
    pool = ThreadPoolExecutor(2)
    out = {"sdk": pool.submit(run_sdk, sdk_python, server.base_url, server.model,
                              *REAL_MODEL_CASES)}  # fmt: skip
    if shutil.which("npm") is not None:  # else the Claude Code test skips (its fixture says why)
        claude = request.getfixturevalue("claude")
        out["claude"] = pool.submit(
            run_claude, claude, server.base_url, server.model, project,
            "Read note.txt and tell me the secret word.",
            "--system-prompt", "You are a coding assistant. Use the Read tool to read files.",
            "--tools", "Read",
        )  # fmt: skip
    pool.shutdown(wait=False)
    return out


def test_anthropic_sdk_against_the_real_model(real_runs: dict[str, Future[dict[str, Any]]]) -> None:
    """Every case connects and parses; what the model said is reported, not judged."""
    out = real_runs["sdk"].result()
    report = {k: v.get("content", v.get("second", v)) for k, v in out["cases"].items()}
    print("anthropic SDK on the real model:", json.dumps(report)[:4000])
    failed = {k: v["error"] for k, v in out["cases"].items() if not v["ok"]}
    assert not failed, failed
    # a call is certain where the constraint asks for one
    assert out["cases"]["tool-any-stream"]["content"][-1]["type"] == "tool_use"


def test_claude_code_against_the_real_model(
    claude: Path, real_runs: dict[str, Future[dict[str, Any]]]
) -> None:
    """Claude Code with a short system prompt and one tool: it must connect, parse and exit
    cleanly; whether the small model reads the file and answers is reported."""
    result = real_runs["claude"].result()
    print("Claude Code on the real model:", json.dumps(result)[:3000])
    assert result.get("type") == "result", result
    assert result.get("api_error_status") is None, result
