"""POST /v1/responses with its real clients, each in the clients venv (.venv-clients): the
openai SDK (responses.create with previous_response_id, retrieve and delete;
responses.stream; responses.parse) and the Agents SDK with its default model class
(OpenAIResponsesModel: Runner.run and run_streamed with a function tool, an output_type task).

Twice: against the real server process over a scripted engine (tests/clients/scripted_server:
the product's app, routes, chat service and guidance backend; only the model's text is
scripted, a call on the first turn and an answer once the tool's output is back), where the
whole call path is asserted; and against the session's real server and model, where only
the protocol is asserted (connected, parsed every event, ended) and whether the 0.5B called
the tool and finished is reported (bench/results/clients/responses-real.json)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clients.scripted_server import Launched
from tests.integration.conftest import API_KEY, Server
from tests.integration.test_ecosystem import clients_python  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "clients" / "responses_clients.py"
REPORTS = ROOT / "bench" / "results" / "clients"
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
ANSWER = "It is sunny in Paris."
KEY = "scripted-key"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    script = {"turns": [CALL, ANSWER], "chat": '{"answer": 42}'}
    with Launched(script, tmp_path_factory.mktemp("scripted"), api_key=KEY) as server:
        yield server


COMMANDS = ["sdk-create", "sdk-stream", "sdk-parse", "agents-run", "agents-stream",
            "agents-output"]  # fmt: skip


def run_clients(
    python: Path, base_url: str, key: str, model: str, *, together: bool = False
) -> dict[str, Any]:
    """Every client command, in one process of the clients venv; their reports by name
    (`together`: sent at once, for the real model's engine to batch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key,
            "OPENAI_AGENTS_DISABLE_TRACING": "1"}  # fmt: skip
    done = subprocess.run(
        [str(python), str(SCRIPT), model, *COMMANDS, *(["--together"] if together else [])],
        capture_output=True, text=True, timeout=540, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reports: dict[str, Any] = json.loads(done.stdout)
    return reports


@pytest.fixture(scope="module")
def scripted_runs(clients_python: Path, scripted: Launched) -> dict[str, Any]:  # noqa: F811
    return run_clients(clients_python, scripted.base_url, KEY, "scripted")


def _prompts(server: Launched) -> list[str]:
    return [str(r["body"].get("prompt", "")) for r in server.requests()]


def _ok(report: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in report, report.get("traceback", report)
    return report


# --------------------------------------------------------------------------- scripted engine
def test_sdk_create_chain_retrieve_delete(
    scripted_runs: dict[str, Any], scripted: Launched
) -> None:
    r = _ok(scripted_runs["sdk-create"])
    [call] = r["first"]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert r["usage"]["input_tokens"] > 0 and "cached_tokens" in r["usage"]["input_tokens_details"]
    assert r["second_text"] == ANSWER
    assert r["retrieved_same"] is True and r["after_delete"] == "NotFoundError"
    # the second turn was rebuilt from the stored chain: the tool's output reached the prompt
    assert any("temperature_c" in p and "What is the weather in Paris?" in p
               for p in _prompts(scripted))  # fmt: skip


def test_sdk_stream(scripted_runs: dict[str, Any]) -> None:
    r = _ok(scripted_runs["sdk-stream"])
    kinds = [k.removeprefix("response.") for k in r["events"]]
    assert kinds[:3] == ["created", "in_progress", "output_item.added"]
    assert kinds[-3:] == ["function_call_arguments.done", "output_item.done", "completed"]
    assert r["final"][0]["parsed_arguments"] == {"city": "Paris"}


def test_sdk_parse(scripted_runs: dict[str, Any]) -> None:
    r = _ok(scripted_runs["sdk-parse"])
    assert r["parsed"] == {"answer": 42}


def test_agents_run_with_a_function_tool(scripted_runs: dict[str, Any], scripted: Launched) -> None:
    r = _ok(scripted_runs["agents-run"])
    assert r["calls"] == ["get_weather"] and len(r["tool_values"]) == 1
    assert r["final_output"] == ANSWER and r["responses"] == 2
    # what the tool returned went back to the model
    assert any(f"Paris: {r['tool_values'][0]} C and sunny" in p for p in _prompts(scripted))


def test_agents_run_streamed(scripted_runs: dict[str, Any]) -> None:
    r = _ok(scripted_runs["agents-stream"])
    assert r["final_output"] == ANSWER and len(r["tool_values"]) == 1
    assert r["raw_events"].count("response.completed") == 2


def test_agents_output_type(scripted_runs: dict[str, Any]) -> None:
    r = _ok(scripted_runs["agents-output"])
    assert r["final_output"] == {"answer": 42} and r["type"] == "Answer"


# --------------------------------------------------------------------------- the real model
PROTOCOL_ERRORS = ("APIError", "APIConnectionError", "ValidationError", "KeyError",
                   "TypeError", "AttributeError", "JSONDecodeError")  # fmt: skip


def test_real_model_reported(clients_python: Path, server: Server) -> None:  # noqa: F811
    """Every client case against the real model: the protocol must hold (no API, connection
    or parsing error); what the model did is reported, not asserted."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    results = run_clients(
        clients_python, server.base_url + "/v1", API_KEY, server.model, together=True
    )
    versions = results.pop("versions")
    for r in results.values():
        r.pop("traceback", None)
    report = {"versions": versions, "model": server.model, **results}
    (REPORTS / "responses-real.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({c: r.get("error") or "ok" for c, r in results.items()}, indent=1))
    broken = {c: r["error"] for c, r in results.items()
              if str(r.get("error", "")).startswith(PROTOCOL_ERRORS)}  # fmt: skip
    assert not broken, broken
