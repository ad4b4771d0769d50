"""The client-task bench (loopstack.bench.clients) without a model: the strict checkers (wrong
answers must fail), the proxy's reading of the three APIs' answers, and the aggregation and outputs
over fake runs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from loopstack.bench.clients import command, proxy, runs
from loopstack.bench.clients.checks import (
    check_agents_output,
    check_claude,
    check_codex,
    check_weather_answer,
    negated,
    says_done,
    states_number,
)
from loopstack.bench.clients.report import markdown, summarise, write_outputs
from loopstack.bench.clients.runs import RunRecord

# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "answer",
    [
        "The weather in Paris is 17°C and foggy.",
        "It's foggy in Paris, 17 °C.",
        "Paris: 17 degrees Celsius, foggy",
        "Currently 17C and foggy in Paris (about 63°F).",
        "The get_weather tool says 17°C and foggy; no rain was mentioned.",
    ],
)
def test_states_number_accepts_the_value(answer: str) -> None:
    assert states_number(answer, 17).done, answer


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("The weather in Paris is 170°C.", "not in"),  # a longer number
        ("It is 17.5 degrees in Paris.", "not in"),  # a decimal
        ("It is -17 °C in Paris.", "not in"),  # another sign, another value
        ("It is 1.7 degrees.", "not in"),
        ("It is not 17°C in Paris.", "negation"),
        ("I couldn't get the weather, so I can't say if it is 17°C.", "negation"),
        ("It isn't 17 degrees today.", "negation"),
        ("The temperature is 21°C and foggy.", "not in"),  # a guess
        ("It is 17°C, or maybe 21°C, and foggy.", "also states"),  # contradicts itself
        ("It is 17°C (90°F) and foggy.", "conversion"),  # a wrong conversion
        ("", "no answer"),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "not in"),  # a repeated call
    ],
)
def test_states_number_rejects_wrong_answers(answer: str, why: str) -> None:
    verdict = states_number(answer, 17)
    assert not verdict.done, answer
    assert why in verdict.why, verdict


def test_negation_is_read_per_clause() -> None:
    text = "I could not reach the site. But the tool says 17°C."
    assert not negated(text, text.index("17"))
    assert negated("It is not 17", 10)


def test_weather_round_trip_needs_the_tool_and_no_error() -> None:
    good = {"answer": "Paris is 23°C and foggy.", "tool_ran": ["Paris"]}
    assert check_weather_answer(good, 23).done
    assert not check_weather_answer({**good, "tool_ran": []}, 23).done  # guessed right
    assert not check_weather_answer({**good, "error": "APIError: boom"}, 23).done
    assert not check_weather_answer(good, 32).done  # digits swapped
    gave_up = {"answer": None, "tool_ran": ["Paris"] * 4, "gave_up": "no answer in 4 calls"}
    assert check_weather_answer(gave_up, 23).why == "no answer in 4 calls"


# --------------------------------------------------------------------------- Agents SDK


def test_agents_output_exact() -> None:
    out = {"city": "Paris", "temperature_c": 17, "conditions": "foggy"}
    report = {"output": out, "output_type": "WeatherReport", "tool_ran": ["Paris"]}
    assert check_agents_output(report, 17).done
    wrong: list[dict[str, Any]] = [
        {**report, "output": {**out, "temperature_c": 18}},
        {**report, "output": {**out, "temperature_c": "17"}},  # not validated as the model
        {**report, "output": {**out, "temperature_c": True}},
        {**report, "output": {**out, "city": "London"}},
        {**report, "output_type": "str", "output": "17°C"},
        {**report, "tool_ran": []},
        {**report, "error": "MaxTurnsExceeded: Max turns (4) exceeded"},
        {**report, "output": None},
    ]
    for r in wrong:
        assert not check_agents_output(r, 17).done, r


# --------------------------------------------------------------------------- Codex


def _codex_events(message: str, completed: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "item.completed", "item": {"type": "file_change", "status": "completed"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": message}},
    ]
    return [*events, {"type": "turn.completed"}] if completed else events


def test_codex_checker() -> None:
    files = {"notes.txt": "loopstack kestrel-1234\n"}
    ok = check_codex(_codex_events("Done: I created notes.txt."), files, "notes.txt",
                     "loopstack kestrel-1234")  # fmt: skip
    assert ok.done, ok
    cases = [
        (_codex_events("Done."), {}, "not created"),
        (_codex_events("Done."), {"notes.txt": "loopstack kestrel-1235\n"}, "holds"),
        (_codex_events("Done."), {"notes.txt": "loopstack kestrel-1234\nmore\n"}, "holds"),
        (_codex_events("Done.", completed=False), files, "never completed"),
        (_codex_events("I could not create the file."), files, "does not say done"),
        (_codex_events("Which file do you mean?"), files, "does not say done"),
    ]
    for events, got, why in cases:
        verdict = check_codex(events, got, "notes.txt", "loopstack kestrel-1234")
        assert not verdict.done and why in verdict.why, (got, verdict)


def test_says_done() -> None:
    assert says_done("I have created notes.txt.")
    assert says_done("The file was not there, so I created it.")  # a negation elsewhere
    assert not says_done("I have not created the file yet.")
    assert not says_done("Unable to finish: the patch was rejected, nothing done")


# --------------------------------------------------------------------------- Claude Code


def test_claude_checker() -> None:
    result = {"type": "result", "is_error": False, "result": "The secret word is QUARTZ-4821."}
    assert check_claude(result, "QUARTZ-4821").done
    wrong = [
        {**result, "result": "The secret word is QUARTZ-4812."},
        {**result, "result": "The secret word is quartz-4821."},  # exact
        {**result, "result": "I can't tell you whether it is QUARTZ-4821."},
        {**result, "is_error": True},
        {"type": "error", "result": "QUARTZ-4821"},
    ]
    for r in wrong:
        assert not check_claude(r, "QUARTZ-4821").done, r


# --------------------------------------------------------------------------- the proxy


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: x\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_proxy_reads_a_responses_stream_in_pieces() -> None:
    ex = proxy.Exchange("POST", "/v1/responses", started=100.0, model_request=True)
    body = _sse(
        {"type": "response.created", "response": {"output": []}},
        {"type": "response.output_item.added", "item": {"type": "function_call"}},
        {"type": "response.function_call_arguments.delta", "delta": "{"},
        {"type": "response.output_item.done", "item": {"type": "function_call"}},
        {"type": "response.completed", "response": {}},
    )
    cut = body.index(b"function_call_arguments") - 20  # a line split across two chunks
    ex.feed(body[:cut], 100.5)
    assert ex.first_output_s is None  # only the created and added events so far
    ex.feed(body[cut:], 102.0)
    assert ex.first_output_s == 2.0 and ex.tool_calls == 1 and ex.error is None


def test_proxy_reads_messages_and_chat_streams() -> None:
    msg = proxy.Exchange("POST", "/v1/messages", started=0.0, model_request=True)
    msg.feed(_sse({"type": "message_start", "message": {"content": []}}, {"type": "ping"}), 1.0)
    msg.feed(_sse({"type": "content_block_start", "content_block": {"type": "tool_use"}}), 3.0)
    msg.feed(_sse({"type": "content_block_delta", "delta": {}}), 4.0)
    assert (msg.first_output_s, msg.tool_calls) == (3.0, 1)
    chat = proxy.Exchange("POST", "/v1/chat/completions", started=0.0, model_request=True)
    chat.feed(_sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 1.0)
    call = {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": ""}}
    chat.feed(_sse({"choices": [{"delta": {"tool_calls": [call]}}]}), 2.0)
    more = {"index": 0, "function": {"arguments": "{}"}}
    chat.feed(_sse({"choices": [{"delta": {"tool_calls": [more]}}]}) + b"data: [DONE]\n", 2.5)
    assert (chat.first_output_s, chat.tool_calls) == (2.0, 1)


def test_proxy_reads_errors_and_whole_answers() -> None:
    failed = proxy.Exchange("POST", "/v1/responses", started=0.0, model_request=True)
    failed.feed(_sse({"type": "response.failed", "response": {"error": {"code": "x"}}}), 1.0)
    assert failed.error and failed.first_output_s is None
    whole = proxy.Exchange("POST", "/v1/messages", started=0.0, model_request=True, status=200)
    whole.finish_whole(json.dumps({"content": [{"type": "tool_use"}, {"type": "text"}]}).encode(),
                       5.0)  # fmt: skip
    assert (whole.first_output_s, whole.tool_calls) == (5.0, 1)
    bad = proxy.Exchange("POST", "/v1/messages", started=0.0, model_request=True, status=400)
    bad.finish_whole(b'{"type": "error"}', 1.0)
    assert bad.error and bad.first_output_s is None
    assert proxy.is_model_request("POST", "/v1/messages")
    assert not proxy.is_model_request("POST", "/v1/messages/count_tokens")
    assert not proxy.is_model_request("GET", "/v1/responses")


# --------------------------------------------------------------------------- aggregation


def _record(target: str, client: str, run: int, done: bool, first: float | None,
            turns: int = 2, error: str | None = None) -> RunRecord:  # fmt: skip
    why = "ok" if done else "17 not in the answer"
    unanswered = 1 if first is None else 0
    return RunRecord(target, client, run, done, why, turns, 1, first, 10.0 * run, error,
                     unanswered)  # fmt: skip


def test_summary_cold_and_cached() -> None:
    records = [
        _record("loopstack", "anthropic", 1, True, 30.0),
        _record("loopstack", "anthropic", 2, True, 1.0),
        _record("loopstack", "anthropic", 3, False, 3.0, turns=4, error="HTTP 400"),
        _record("baseline", "anthropic", 1, False, None, turns=0, error="HTTP 404"),
    ]
    ours, base = summarise(records)
    assert (ours.target, ours.runs, ours.done, ours.errors) == ("loopstack", 3, 2, 1)
    assert ours.first_token_cold_s == 30.0 and ours.first_token_cached_s == 2.0
    assert ours.turns_median == 2 and ours.wall_median_s == 20.0
    assert ours.last_failure == "17 not in the answer"
    assert base.first_token_cold_s is None and base.first_token_cached_s is None
    assert base.done == 0 and base.errors == 1 and base.unanswered == 1 and ours.unanswered == 0


def test_outputs_written(tmp_path: Path) -> None:
    target = {"name": "loopstack", "base_url": "http://x/v1", "model": "m"}
    meta = {"created": "2026-12-07T18:00:00", "command": "bench", "targets": [target]}
    records = [_record("loopstack", "codex", 1, False, None)]
    records.append(_record("loopstack", "codex", 2, True, 4.0))
    paths = write_outputs(tmp_path, meta, records)
    data = json.loads(paths[0].read_text())
    assert data["summary"][0]["done"] == 1 and len(data["runs"]) == 2
    md = paths[1].read_text()
    assert "| loopstack | codex | 1/2 | 2.0 | 1.0 | 1 |" in md and "model `m`" in md
    assert md == markdown(summarise(records), meta)


def test_draws_and_names() -> None:
    rng = random.Random(1)
    values = {runs.draw_value(rng) for _ in range(200)}
    assert values and all(3 <= v <= 38 and v % 5 for v in values)
    assert runs.root_url("http://h:1/v1/") == "http://h:1"
    assert command.CLIENTS == runs.CLIENTS  # the command's copy of the names
    assert command.parse_clients("codex, anthropic") == ["codex", "anthropic"]
    with pytest.raises(Exception, match="clients are among"):
        command.parse_clients("codex,cursor")


def test_a_missing_client_is_named(tmp_path: Path) -> None:
    setup = runs.Setup(tmp_path / "py", tmp_path / "npm", tmp_path, 5.0)
    with pytest.raises(runs.ClientMissing) as err:
        setup.binary("codex")
    assert err.value.client == "codex" and str(tmp_path / "npm") in err.value.path


# --------------------------------------------------------------------------- through a socket


def test_the_proxy_passes_answers_unchanged_and_measures_them() -> None:
    """A fake upstream (a Starlette app on a socket) behind the real proxy."""
    import threading
    import time

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    start = {"type": "message_start", "message": {"content": []}}
    stream = _sse(start, {"type": "content_block_start", "content_block": {"type": "tool_use"}})

    async def messages(request: Request) -> Response:
        body = await request.json()
        assert body == {"hello": "world"} and request.headers["x-api-key"] == "k"
        return StreamingResponse(iter([stream[:30], stream[30:]]), media_type="text/event-stream",
                                 headers={"x-loopstack-selection": "abstain"})  # fmt: skip

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m"}]})

    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"]),
                            Route("/v1/models", models)])  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with proxy.running_proxy(f"http://127.0.0.1:{port}") as (measuring, root):
            r = httpx.post(root + "/v1/messages", json={"hello": "world"},
                           headers={"x-api-key": "k"})  # fmt: skip
            assert r.status_code == 200 and r.content == stream
            assert httpx.get(root + "/v1/models").json() == {"data": [{"id": "m"}]}
            assert command.resolve_model(root + "/v1", "k", None) == "m"
            first, listed, _ = measuring.since(0)
    finally:
        server.should_exit = True
        thread.join(10)
    assert first.model_request and first.streamed and first.tool_calls == 1
    assert first.first_output_s is not None and first.notes == {"x-loopstack-selection": "abstain"}
    assert json.loads(first.request_body) == {"hello": "world"}
    assert not listed.model_request and listed.status == 200


def test_cli_setups(tmp_path: Path) -> None:
    from loopstack.bench.clients import setup

    argv = setup.codex_argv(Path("codex"), tmp_path, "m", "do it", "--disable", "view_image")
    assert argv[-1] == "do it" and argv[argv.index("view_image") - 1] == "--disable"
    assert argv.index("view_image") > argv.index('web_search="disabled"')  # after the lean ones
    setup.codex_home(tmp_path / "home", "http://h/v1", "m")
    toml = (tmp_path / "home" / "config.toml").read_text()
    assert 'base_url = "http://h/v1"' in toml and 'wire_api = "responses"' in toml
    env = setup.claude_env(tmp_path, "http://h", "k", "m")
    assert env["ANTHROPIC_BASE_URL"] == "http://h" and env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "m"


# --------------------------------------------------------------------------- the command


FAKE_SDK = """#!/bin/sh
# A stand-in for the clients venv's python, run as `python sdk_tasks.py CLIENT MODEL VALUE`:
# it answers with the drawn value ($4) in a sentence.
printf '{"answer": "Paris is %s and foggy.", "tool_ran": ["Paris"]}' "ANSWER"
"""


@pytest.mark.parametrize(("answer", "done"), [("$4°C", "1/1"), ("not $4°C", "0/1")])
def test_the_command_end_to_end_with_a_fake_client(tmp_path: Path, answer: str, done: str) -> None:
    """`loopstack bench clients` through typer, the proxy and a fake SDK client that states
    the drawn value (or negates it): the checker's verdict reaches both outputs."""
    import threading
    import time

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from typer.testing import CliRunner

    from loopstack.bench import cli

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "fake-model"}]})

    app = Starlette(routes=[Route("/v1/models", models)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(FAKE_SDK.replace("ANSWER", answer))
    fake.chmod(0o755)
    out = tmp_path / "out"
    try:
        res = CliRunner().invoke(cli.app, [
            "clients", "--base-url", f"http://127.0.0.1:{port}/v1", "--runs", "1",
            "--clients", "openai-chat", "--clients-venv", str(venv), "--out", str(out),
        ])  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(10)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "result.json").read_text())
    [run] = data["runs"]
    assert data["targets"][0]["model"] == "fake-model"
    assert f"| loopstack | openai-chat | {done} |" in (out / "results.md").read_text(), run
    assert run["turns"] == 0 and run["detail"]["value"] in range(3, 39)
