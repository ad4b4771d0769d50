"""Tool calls through the real server: every tool_choice mode, streamed and not, parallel
calls, the tool-result round trip. Every argument string must parse and validate."""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

from tests.integration.conftest import Server, send_at_once

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 5, "maximum": 9},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
EMAIL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "description": "Send an email",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "body": {"type": "string", "maxLength": 80}},
            "required": ["to", "body"],
        },
    },
}
TOOLS = [WEATHER, EMAIL]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# the tool_choice of each calling mode (a call must come back), by name
CHOICES: dict[str, Any] = {
    "required": "required",
    "auto": "auto",
    "named": {"type": "function", "function": {"name": "get_weather"}},
}
ASK = [{"role": "user", "content": "What's the weather in Paris for the next 3 days, in celsius?"}]


def assert_valid(calls: list[Any]) -> None:
    assert calls, "expected at least one tool call"
    for call in calls:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        assert call.id and call.type == "function"


def collect_stream(stream: Any) -> tuple[dict[int, dict[str, str]], str | None, str]:
    calls: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] = tc.function.name or slot["name"]
                    slot["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return calls, finish, content


HAIKU = [{"role": "user", "content": "Write a haiku about autumn leaves."}]
TWO_CITIES = [{"role": "user", "content": "Weather for Paris and for Tokyo, 7 days each."}]
# The non-streamed cases' requests, sent at once by `replies` (the engine batches them)
WHOLE: dict[str, dict[str, Any]] = {
    **{
        mode: {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 96}
        for mode, choice in CHOICES.items()
    },
    "named_email": {
        "messages": ASK, "tools": TOOLS, "max_tokens": 96,
        "tool_choice": {"type": "function", "function": {"name": "send_email"}},
    },
    "none": {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 32},
    "haiku": {"messages": HAIKU, "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 48},
    "two_cities": {
        "messages": TWO_CITIES, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 160
    },
    "one_call": {
        "messages": TWO_CITIES, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 96,
        "parallel_tool_calls": False,
    },
}  # fmt: skip


# The streamed cases' requests, sent at once with the non-streamed ones
STREAMED: dict[str, dict[str, Any]] = {
    **{
        f"stream_{mode}": {
            "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 96,
            "temperature": 0,
        }
        for mode, choice in CHOICES.items()
    },
    "stream_none": {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 24},
}  # fmt: skip


def streamed(
    client: OpenAI, kw: dict[str, Any]
) -> tuple[dict[int, dict[str, str]], str | None, str]:
    return collect_stream(client.chat.completions.create(**kw, stream=True))


@pytest.fixture(scope="module")
def replies(client: OpenAI, server: Server) -> dict[str, Future[Any]]:
    """Every case's first request at once, streamed and not (one after the other they took
    ~35 s of `make test` in float32, the streamed ones ~40 s more)."""
    out = send_at_once(
        client,
        {case: {**kw, "model": server.model, "temperature": 0} for case, kw in WHOLE.items()},
    )
    pool = ThreadPoolExecutor(len(STREAMED))
    for case, kw in STREAMED.items():
        out[case] = pool.submit(streamed, client, {**kw, "model": server.model})
    pool.shutdown(wait=False)
    return out


@pytest.mark.parametrize("case", list(CHOICES))
def test_tool_choice_modes(replies: dict[str, Future[Any]], case: str) -> None:
    r = replies[case].result()
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert_valid(msg.tool_calls or [])
    assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
    days = json.loads(msg.tool_calls[0].function.arguments)["days"]
    assert 5 <= days <= 9  # the user said 3: only the constraint keeps it in bounds


def test_named_forces_the_named_tool(replies: dict[str, Future[Any]]) -> None:
    calls = replies["named_email"].result().choices[0].message.tool_calls or []
    assert_valid(calls)
    assert {c.function.name for c in calls} == {"send_email"}


def test_none_never_calls(replies: dict[str, Future[Any]]) -> None:
    r = replies["none"].result()
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_auto_answers_in_text_when_no_tool_fits(replies: dict[str, Future[Any]]) -> None:
    msg = replies["haiku"].result().choices[0].message
    assert not msg.tool_calls and msg.content


@pytest.mark.parametrize("mode", list(CHOICES))
def test_streamed_tool_calls(replies: dict[str, Future[Any]], mode: str) -> None:
    calls, finish, _ = replies[f"stream_{mode}"].result()
    assert finish == "tool_calls"
    assert calls
    for call in calls.values():
        assert call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    # The streamed arguments are the ones the same request, not streamed, returns.
    first = (replies[mode].result().choices[0].message.tool_calls or [])[0]
    assert calls[0]["arguments"] == first.function.arguments


def test_streamed_none(replies: dict[str, Future[Any]]) -> None:
    calls, finish, content = replies["stream_none"].result()
    assert not calls and content and finish in ("stop", "length")


def test_two_cities_every_call_valid(replies: dict[str, Future[Any]]) -> None:
    """parallel_tool_calls=true lets the model continue with another call after each one.
    Qwen2.5-Coder-0.5B always stops after one (also unconstrained, also with few-shot
    history), so multi-call assembly is covered in tests/unit with a scripted engine; here
    we check what the real model returns: valid calls, distinct ids."""
    calls = replies["two_cities"].result().choices[0].message.tool_calls or []
    assert_valid(calls)
    assert len({c.id for c in calls}) == len(calls)
    cities = {json.loads(c.function.arguments)["city"].lower() for c in calls}
    assert cities & {"paris", "tokyo"}


def test_parallel_tool_calls_false_gives_one(replies: dict[str, Future[Any]]) -> None:
    assert len(replies["one_call"].result().choices[0].message.tool_calls or []) == 1


def test_tool_result_round_trip(
    client: OpenAI, server: Server, replies: dict[str, Future[Any]]
) -> None:
    first = replies["required"].result()  # ASK, required: a call to get_weather
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"forecast": "sunny, 21 degrees celsius every day"}),
        },
    ]
    after = {"model": server.model, "messages": messages, "tools": TOOLS, "max_tokens": 64,
             "temperature": 0}  # fmt: skip
    sent = send_at_once(
        client, {"auto": {**after, "tool_choice": "auto"}, "none": {**after, "tool_choice": "none"}}
    )
    # auto: the 0.5B model often calls the tool again after a result; either way the reply
    # must be well formed (text, or calls that validate).
    msg = sent["auto"].result().choices[0].message
    if msg.tool_calls:
        assert_valid(msg.tool_calls)
    else:
        assert msg.content
    # none: the model must answer in text, and the tool's result must have reached it.
    answer = sent["none"].result()
    text = (answer.choices[0].message.content or "").lower()
    assert not answer.choices[0].message.tool_calls
    assert "sunny" in text or "21" in text
