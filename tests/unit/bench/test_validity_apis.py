"""The validity bench through /v1/responses and /v1/messages: the translations of one corpus
request, reading each API's calls back, valid / invalid / 4xx records per API against a
scripted server (httpx.MockTransport), and whole runs through the real serving app
(ASGI, scripted engine) so the bodies are the ones our server accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from loopstack.bench import common as _client
from loopstack.bench.serving import tool_validity, wire_apis

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
}
ENTRY = {
    "id": "t-1",
    "source": "test",
    "tool": {
        "type": "function",
        "function": {"name": "weather", "description": "Weather.", "parameters": SCHEMA},
    },
    "prompt": "Weather in Oslo for 3 days?",
    "distractors": ["other"],
}
OTHER = {
    "id": "t-2",
    "source": "test",
    "tool": {
        "type": "function",
        "function": {"name": "other", "parameters": {"type": "object", "properties": {}}},
    },
    "prompt": "Do the other thing.",
    "distractors": ["weather"],
}
INDEX = _client.tool_index([ENTRY, OTHER])


def kwargs(mode: str, arm: str = "constrained") -> dict[str, Any]:
    return tool_validity.request_kwargs(ENTRY, mode, arm, INDEX, "m", 64, 0.0, 5)


# --------------------------------------------------------------------------- translations
def test_responses_body_each_mode() -> None:
    body = wire_apis.responses_body(kwargs("required"))
    assert body["input"] == [{"type": "message", "role": "user", "content": ENTRY["prompt"]}]
    assert body["tools"][0] == {
        "type": "function",
        "name": "weather",
        "description": "Weather.",
        "parameters": SCHEMA,
    }
    assert [t["name"] for t in body["tools"]] == ["weather", "other"]
    assert body["tool_choice"] == "required" and body["max_output_tokens"] == 64
    assert "max_tokens" not in body and "messages" not in body and "seed" not in body
    assert "loopstack" not in body
    named = wire_apis.responses_body(kwargs("named"))
    assert named["tool_choice"] == {"type": "function", "name": "weather"}
    unc = wire_apis.responses_body(kwargs("auto", "unconstrained"))
    assert unc["tool_choice"] == "auto" and unc["loopstack"] == {"constrained": False}
    strict = dict(ENTRY["tool"]["function"], strict=True)  # type: ignore[arg-type]
    assert wire_apis.responses_tool({"type": "function", "function": strict})["strict"] is True


def test_messages_body_each_mode() -> None:
    body = wire_apis.messages_body(kwargs("required"))
    assert body["messages"] == [{"role": "user", "content": ENTRY["prompt"]}]
    assert body["tools"][0] == {
        "name": "weather",
        "description": "Weather.",
        "input_schema": SCHEMA,
    }
    assert body["tools"][1]["name"] == "other" and "description" not in body["tools"][1]
    assert body["tool_choice"] == {"type": "any"} and body["max_tokens"] == 64
    assert "seed" not in body and "loopstack" not in body
    assert wire_apis.messages_body(kwargs("auto"))["tool_choice"] == {"type": "auto"}
    named = wire_apis.messages_body(kwargs("named"))["tool_choice"]
    assert named == {"type": "tool", "name": "weather"}
    assert not wire_apis.arm_supported("messages", "unconstrained")
    assert wire_apis.arm_supported("responses", "unconstrained")


def test_parse_apis() -> None:
    assert wire_apis.parse_apis("chat, responses,messages,chat") == [
        "chat",
        "responses",
        "messages",
    ]
    with pytest.raises(SystemExit, match="unknown api"):
        wire_apis.parse_apis("chat,grpc")


def test_answers_read_back_into_the_chat_shape() -> None:
    resp = wire_apis.from_responses(
        {
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "On it."}]},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "weather",
                    "arguments": '{"city": "Oslo"}',
                },
            ],
            "usage": {"output_tokens": 9},
        }
    )
    assert resp.message["content"] == "On it." and resp.finish_reason == "tool_calls"
    assert resp.message["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
    }
    assert resp.completion_tokens == 9
    cut = wire_apis.from_responses(
        {"output": [], "incomplete_details": {"reason": "max_output_tokens"}}
    )
    assert cut.finish_reason == "length" and cut.message["tool_calls"] == []
    msg = wire_apis.from_messages(
        {
            "content": [{"type": "tool_use", "id": "u", "name": "weather", "input": {"city": 1}}],
            "stop_reason": "tool_use",
            "usage": {"output_tokens": 4},
        }
    )
    assert msg.message["tool_calls"][0]["function"] == {"name": "weather", "arguments": {"city": 1}}
    assert msg.finish_reason == "tool_calls" and msg.completion_tokens == 4


# --------------------------------------------------------------------------- scripted server
class ScriptedServer:
    """/models, /chat/completions, /responses and /messages: every answer calls the tool
    named (or the first offered) with ``days`` = `days`; `status` >= 400 answers an error."""

    def __init__(self, days: int = 3, status: int = 200) -> None:
        self.days = days
        self.status = status
        self.paths: list[str] = []
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}
            return httpx.Response(200, json={"object": "list", "data": [model]})
        body = json.loads(request.content)
        api = path.rsplit("/", 1)[-1]
        self.bodies.setdefault(api, []).append(body)
        if self.status >= 400:
            err = {"type": "invalid_request_error", "message": f"bad {api} request"}
            return httpx.Response(self.status, json={"type": "error", "error": err})
        args = {"city": "Oslo", "days": self.days}
        if api == "responses":
            choice = body["tool_choice"]
            name = choice["name"] if isinstance(choice, dict) else body["tools"][0]["name"]
            item = {"type": "function_call", "call_id": "c", "name": name,
                    "arguments": json.dumps(args)}  # fmt: skip
            return httpx.Response(200, json={"output": [item], "usage": {"output_tokens": 5}})
        if api == "messages":
            name = body["tool_choice"].get("name") or body["tools"][0]["name"]
            block = {"type": "tool_use", "id": "u", "name": name, "input": args}
            return httpx.Response(200, json={"content": [block], "stop_reason": "tool_use"})
        choice = body["tool_choice"]
        name = choice["function"]["name"] if isinstance(choice, dict) else "weather"
        call = {"id": "c", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choices = [{"index": 0, "message": message, "finish_reason": "tool_calls"}]
        return httpx.Response(
            200,
            json={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                  "choices": choices},
        )  # fmt: skip


def _route(monkeypatch: pytest.MonkeyPatch, transport: httpx.AsyncBaseTransport) -> None:
    def make(base_url: str, api_key: str, timeout: float = 60.0) -> AsyncOpenAI:
        http = httpx.AsyncClient(transport=transport)
        return AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)

    def make_http(base_url: str, api_key: str, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, base_url=base_url)

    monkeypatch.setattr(_client, "make_client", make)
    monkeypatch.setattr(wire_apis, "make_http", make_http)


@pytest.fixture()
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps(ENTRY) + "\n")
    return path


def _run(corpus: Path, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["--corpus", str(corpus), "--out", str(out), "--progress", "0", "--arms"]
    rc = tool_validity.main([*argv, "constrained", "--api", "chat,responses,messages", *extra])
    assert rc == 0
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize(("days", "valid"), [(3, True), (30, False)])
def test_each_api_counts_valid_and_invalid_calls(
    monkeypatch: pytest.MonkeyPatch, corpus_file: Path, tmp_path: Path, days: int, valid: bool
) -> None:
    server = ScriptedServer(days=days)
    _route(monkeypatch, httpx.MockTransport(server))
    data = _run(corpus_file, tmp_path / "tv.json", "--modes", "required,named")
    assert set(server.bodies) == {"completions", "responses", "messages"}
    assert {len(b) for b in server.bodies.values()} == {2}
    assert server.bodies["messages"][1]["tool_choice"] == {"type": "tool", "name": "weather"}
    assert data["config"]["apis"] == ["chat", "responses", "messages"]
    records = data["records"]
    assert sorted(r["api"] for r in records) == ["chat"] * 2 + ["messages"] * 2 + ["responses"] * 2
    assert all(r["status"] == "ok" and r["n_calls"] == 1 for r in records)
    assert all(r["valid"] is valid and r["right_name"] for r in records)
    if not valid:
        assert all("days" in r["error"] for r in records)
    for mode in ("required", "named"):
        arms = data["summary"][mode]
        assert set(arms) == {"constrained", "responses/constrained", "messages/constrained"}
        assert {s["valid"] for s in arms.values()} == {int(valid)}
        assert arms["messages/constrained"]["api"] == "messages"


def test_a_4xx_is_an_error_record_per_api(
    monkeypatch: pytest.MonkeyPatch,
    corpus_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _route(monkeypatch, httpx.MockTransport(ScriptedServer(status=400)))
    data = _run(corpus_file, tmp_path / "tv.json", "--modes", "auto")
    by_api = {r["api"]: r for r in data["records"]}
    assert set(by_api) == {"chat", "responses", "messages"}
    assert all(r["status"] == "http_error" for r in by_api.values())
    assert by_api["responses"]["error"] == "HTTP 400: bad responses request"
    assert by_api["messages"]["error"] == "HTTP 400: bad messages request"
    assert by_api["chat"]["error"].startswith("HTTP 400")
    for s in data["summary"]["auto"].values():
        assert s["http_errors"] == 1 and s["answered"] == 0 and s["calls_produced"] == 0
    assert "responses/constrained" in capsys.readouterr().out


def test_messages_skips_the_unconstrained_arm(
    monkeypatch: pytest.MonkeyPatch,
    corpus_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = ScriptedServer()
    _route(monkeypatch, httpx.MockTransport(server))
    out = tmp_path / "tv.json"
    argv = ["--corpus", str(corpus_file), "--out", str(out), "--progress", "0"]
    assert tool_validity.main([*argv, "--modes", "required", "--api", "responses,messages"]) == 0
    arms = json.loads(out.read_text())["summary"]["required"]
    assert set(arms) == {"responses/constrained", "responses/unconstrained", "messages/constrained"}
    assert [b.get("loopstack") for b in server.bodies["responses"]].count(
        {"constrained": False}
    ) == 1
    assert "skipped: messages/unconstrained" in capsys.readouterr().err


# --------------------------------------------------------------------------- real server
async def test_runs_through_the_real_server(
    monkeypatch: pytest.MonkeyPatch, corpus_file: Path, tmp_path: Path
) -> None:
    """The translated bodies go through our own router and chat service (scripted engine):
    200s with one valid call per API and mode under the constraint, read back from each
    API's own shape; the unconstrained arm (chat, responses: the switch reaches the server)
    returns the engine's raw out-of-range call, counted invalid."""
    from tests.unit.serving.serving_fakes import Harness
    from tests.unit.serving.serving_helpers import call

    h = Harness()
    h.engine.constrained = [call("weather", {"city": "Oslo", "days": 3})]
    h.engine.free = [
        "<tool_call>\n" + call("weather", {"city": "Oslo", "days": 30}) + "\n</tool_call>"
    ]
    _route(monkeypatch, httpx.ASGITransport(app=h.app))
    out = tmp_path / "tv.json"
    argv = ["--corpus", str(corpus_file), "--out", str(out), "--progress", "0"]
    argv += ["--base-url", "http://loopstack.test/v1", "--arms", "constrained,unconstrained"]
    argv += ["--modes", "required,named", "--api", "chat,responses,messages"]
    args = tool_validity.parse_args(argv)
    assert await tool_validity.run(args) == 0
    await h.client.aclose()
    records = json.loads(out.read_text())["records"]
    assert len(records) == 10  # messages has no unconstrained arm
    assert all(r["status"] == "ok" and r["name"] == "weather" for r in records), records
    con = [r for r in records if r["arm"] == "constrained"]
    assert sorted(r["api"] for r in con) == ["chat"] * 2 + ["messages"] * 2 + ["responses"] * 2
    assert all(r["valid"] and r["completion_tokens"] > 0 for r in con)
    unc = [r for r in records if r["arm"] == "unconstrained"]
    assert sorted(r["api"] for r in unc) == ["chat"] * 2 + ["responses"] * 2
    assert all(not r["valid"] and "days" in r["error"] for r in unc)
