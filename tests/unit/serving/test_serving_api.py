"""The router and ChatService end to end over ASGI, with a fake engine and tokenizer."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from serving.chat import MAX_ATTEMPTS
from serving.prompt import TOOL_CALL_OPEN
from tests.unit.serving.serving_fakes import ENGINE_METRICS, MODEL, Harness

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
EVEN = {  # multipleOf: the regex cannot enforce it, the output is validated
    "type": "function",
    "function": {
        "name": "set_even",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "multipleOf": 2}},
            "required": ["n"],
        },
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
PARIS = {"city": 'Paris {"x"}', "days": 3}


def call(name: str, args: Any) -> str:
    """What the model writes under the regex: our envelope, compact arguments."""
    compact = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return '{"name": "' + name + '", "arguments": ' + compact + "}"


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, **kw}


async def post_chat(h: Harness, **kw: Any) -> Any:
    return await h.client.post("/v1/chat/completions", json=chat_body(**kw))


def assert_openai_error(resp: Any, status: int, *, type_: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert {"message", "type", "param", "code"} <= err.keys(), err
    assert isinstance(err["message"], str) and err["message"]
    if type_ is not None:
        assert err["type"] == type_
    return err


def sse_events(text: str) -> list[Any]:
    """The JSON objects of an SSE body; asserts it ends with [DONE]."""
    lines = [ln[len("data: ") :] for ln in text.split("\n\n") if ln.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", text[-200:]
    return [json.loads(ln) for ln in lines[:-1]]


def collect_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold chat.completion.chunk deltas into content, tool calls and finish reason."""
    content, calls, finish, usage = "", {}, None, None
    for ev in events:
        assert "error" not in ev, ev
        if ev.get("usage"):
            usage = ev["usage"]
        for choice in ev["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if "id" in tc:
                    assert slot["id"] is None, "a call's id is sent once"
                    slot["id"] = tc["id"]
                    assert tc["type"] == "function"
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] = fn["name"]
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish,
            "usage": usage}  # fmt: skip


# --------------------------------------------------------------------------- request errors
BAD_REQUESTS = [
    pytest.param(chat_body(temperature=3.5), "temperature", id="temperature"),
    pytest.param(chat_body(top_p=0), "top_p", id="top_p"),
    pytest.param({"model": MODEL, "messages": []}, "messages", id="empty-messages"),
    pytest.param({"messages": USER}, "model", id="no-model"),
    pytest.param(
        chat_body(messages=[*USER, {"role": "tool", "content": "18C"}]),
        "messages",
        id="tool-without-id",
    ),
    pytest.param(chat_body(messages=[{"role": "wizard", "content": "x"}]), "messages", id="role"),
    pytest.param(
        chat_body(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]
        ),
        None,  # the message names tools[0].function.parameters
        id="invalid-schema",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
        "tool_choice",
        id="unknown-named-tool",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", id="tool-choice"
    ),
    pytest.param(
        chat_body(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
        "tools",
        id="bad-function-name",
    ),
    pytest.param(
        chat_body(tools=[{"type": "function", "function": {"name": "x" * 65}}]),
        "tools",
        id="long-function-name",
    ),
    pytest.param(chat_body(tools=[WEATHER, ADD, WEATHER]), "tools[2]", id="duplicate-tools"),
    pytest.param(chat_body(tools=[WEATHER], tool_choice="required", n=2), "n", id="n-with-tools"),
    pytest.param(
        chat_body(
            tools=[WEATHER],
            tool_choice="required",
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{not json"},
                        }
                    ],
                },
            ],
        ),
        "messages",
        id="history-arguments-not-json",
    ),
]


@pytest.mark.parametrize("body,param", BAD_REQUESTS)
async def test_bad_requests_are_openai_400s(harness: Harness, body: Any, param: str | None) -> None:
    resp = await harness.client.post("/v1/chat/completions", json=body)
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    if param is None:
        assert "tools[0]" in err["message"], err
    else:
        assert err["param"] is not None and err["param"].startswith(param), err
    assert harness.engine.requests == []


async def test_malformed_json_is_a_400(harness: Harness) -> None:
    resp = await harness.client.post(
        "/v1/chat/completions",
        content=b'{"model": "test-model", "messages": [',
        headers={"content-type": "application/json"},
    )
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert "JSON" in err["message"]
    assert harness.engine.requests == []


async def test_unknown_model_is_a_404(harness: Harness) -> None:
    resp = await harness.client.post("/v1/chat/completions", json={**chat_body(), "model": "gpt"})
    err = assert_openai_error(resp, 404, type_="invalid_request_error")
    assert err["code"] == "model_not_found" and err["param"] == "model"
    resp = await harness.client.post("/v1/completions", json={"model": "gpt", "prompt": "x"})
    assert_openai_error(resp, 404)
    assert harness.engine.requests == []


async def test_unknown_route_is_a_404_error_body(harness: Harness) -> None:
    assert_openai_error(await harness.client.get("/v1/nothing-here"), 404)
    assert_openai_error(await harness.client.post("/v2/chat/completions", json={}), 404)


async def test_context_length_exceeded(make_harness: Any) -> None:
    h = make_harness(max_model_len=40)
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required", max_tokens=10)
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "40" in err["message"]
    assert h.engine.requests == []


# --------------------------------------------------------------------------- auth, admission
async def test_api_key_is_enforced(make_harness: Any) -> None:
    h = make_harness(api_key="sekret")
    h.engine.constrained = [call("get_weather", PARIS)]
    for headers in [{}, {"authorization": "Bearer wrong"}, {"authorization": "Basic sekret"}]:
        resp = await h.client.post("/v1/chat/completions", json=chat_body(), headers=headers)
        err = assert_openai_error(resp, 401, type_="authentication_error")
        assert err["code"] == "invalid_api_key"
        assert_openai_error(await h.client.get("/v1/models", headers=headers), 401)
    assert h.engine.requests == []
    ok = {"authorization": "Bearer sekret"}
    resp = await h.client.post("/v1/chat/completions", json=chat_body(), headers=ok)
    assert resp.status_code == 200, resp.text
    assert (await h.client.get("/v1/models", headers=ok)).status_code == 200
    assert (await h.client.get("/health")).status_code == 200  # probes need no key


async def test_overload_is_a_429_with_retry_after(make_harness: Any) -> None:
    h = make_harness(max_running=1, max_waiting=0)
    h.engine.gate = asyncio.Event()
    first = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)
    resp = await post_chat(h)
    err = assert_openai_error(resp, 429, type_="rate_limit_error")
    assert err["code"] == "overloaded"
    assert resp.headers["retry-after"] == "7"
    assert h.metric("loopstack_requests_rejected_total") == 1
    h.engine.gate.set()
    assert (await asyncio.wait_for(first, 5)).status_code == 200
    # The slot is free again.
    assert (await post_chat(h)).status_code == 200
    assert h.metric("loopstack_requests_running") == 0


async def test_waiting_requests_queue_behind_a_running_one(make_harness: Any) -> None:
    h = make_harness(max_running=1, max_waiting=1)
    h.engine.gate = asyncio.Event()
    first = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)
    second = asyncio.ensure_future(post_chat(h))
    for _ in range(100):
        if h.metric("loopstack_requests_waiting") == 1:
            break
        await asyncio.sleep(0.01)
    assert h.metric("loopstack_requests_waiting") == 1
    assert (await post_chat(h)).status_code == 429
    h.engine.gate.set()
    assert [r.status_code for r in await asyncio.gather(first, second)] == [200, 200]


# --------------------------------------------------------------------------- required / named
async def test_required_mode_sends_the_regex_and_returns_tool_calls(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="required", temperature=0.2)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert body["model"] == MODEL
    msg = choice["message"]
    assert msg["role"] == "assistant" and not msg["content"]
    [tc] = msg["tool_calls"]
    assert tc["type"] == "function" and re.fullmatch(r"call_[A-Za-z0-9]{24}", tc["id"])
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == PARIS
    assert body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )
    assert body["usage"]["completion_tokens"] > 0

    sent = h.engine.completions()
    assert sent and all("structured_outputs" in b for b in sent)
    first = sent[0]
    assert first["model"] == h.engine.model_name
    assert first["prompt"].endswith("<|im_start|>assistant\n" + TOOL_CALL_OPEN)
    assert '"name": "get_weather"' in first["prompt"]  # the template rendered the tools
    assert first["temperature"] == 0.2
    # Stage 1 constrains the head to an offered tool's name ...
    head = first["structured_outputs"]["regex"]
    assert re.fullmatch(head, '{"name": "get_weather", "arguments": ')
    assert re.fullmatch(head, '{"name": "add", "arguments": ')
    assert not re.fullmatch(head, '{"name": "other", "arguments": ')
    assert not re.fullmatch(head, "I think the weather is nice.")
    # ... stage 2 continues after the head with that tool's arguments.
    second = sent[1]
    assert second["prompt"] == first["prompt"] + '{"name": "get_weather", "arguments": '
    args = second["structured_outputs"]["regex"]
    assert re.fullmatch(args, '{"city":"Oslo"}}')
    assert not re.fullmatch(args, '{"city":"Oslo","days":8}}')
    assert not re.fullmatch(args, '{"town":"Oslo"}}')
    assert h.metric("loopstack_tool_calls_total", mode="required", valid="true") == 1


async def test_named_tool_choice_constrains_to_that_tool(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("add", {"a": 2, "b": 40})]
    named = {"type": "function", "function": {"name": "add"}}
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice=named)
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert tc["function"]["name"] == "add"
    [only] = h.engine.completions(constrained=True)  # the head is ours: one stage
    assert only["prompt"].endswith(TOOL_CALL_OPEN + '{"name": "add", "arguments": ')
    regex = only["structured_outputs"]["regex"]
    assert re.fullmatch(regex, '{"a":1,"b":2}}')
    assert not re.fullmatch(regex, '{"city":"Oslo"}}')


async def test_parallel_calls_are_all_returned(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [
        call("get_weather", PARIS) + "\n</tool_call>\n<tool_call>\n",
        call("add", {"a": 1, "b": 2}) + "\n</tool_call>",
    ]
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="required")
    assert resp.status_code == 200, resp.text
    calls = resp.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert len({c["id"] for c in calls}) == 2


async def test_required_mode_streams_the_same_arguments(harness: Harness) -> None:
    h = harness
    text = call("get_weather", PARIS) + "\n</tool_call>"
    h.engine.constrained = [text]
    whole = await post_chat(h, tools=[WEATHER], tool_choice="required")
    expected = whole.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    for chunk in (1, 4, 1000):
        h.engine.chunk = chunk
        h.engine.constrained = [text]
        resp = await post_chat(
            h,
            tools=[WEATHER],
            tool_choice="required",
            stream=True,
            stream_options={"include_usage": True},
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp.text)
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(e["object"] == "chat.completion.chunk" and e["model"] == MODEL for e in events)
        got = collect_stream(events)
        assert got["finish"] == "tool_calls"
        [c] = got["calls"]
        assert c["name"] == expected["name"] and c["arguments"] == expected["arguments"]
        assert c["id"].startswith("call_")
        assert got["usage"]["completion_tokens"] > 0
        if chunk == 1:  # exact schema: arguments go out as they are generated
            n_deltas = sum(
                1 for e in events for ch in e["choices"] for _ in ch["delta"].get("tool_calls", [])
            )
            assert n_deltas > 5


async def test_tool_choice_none_passes_through_to_the_chat_endpoint(harness: Harness) -> None:
    h = harness
    resp = await post_chat(h, tools=[WEATHER], tool_choice="none", top_k=5)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == MODEL
    [(path, body)] = h.engine.requests
    assert path == "/v1/chat/completions"
    assert body["model"] == h.engine.model_name and body["top_k"] == 5
    assert "loopstack" not in body


async def test_response_format_schema_becomes_a_regex(harness: Harness) -> None:
    h = harness
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["answer"],
    }
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    resp = await post_chat(h, response_format=rf)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == {"answer": 42}
    [(path, body)] = h.engine.requests
    assert path == "/v1/chat/completions" and "response_format" not in body
    regex = body["structured_outputs"]["regex"]
    assert re.fullmatch(regex, '{"answer":42}') and not re.fullmatch(regex, '{"answer":420}')


async def test_plain_stream_is_relayed(harness: Harness) -> None:
    resp = await post_chat(harness, stream=True)
    assert resp.status_code == 200, resp.text
    events = sse_events(resp.text)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == (
        harness.engine.chat_content
    )


# --------------------------------------------------------------------------- auto mode
async def test_auto_mode_switches_to_a_constrained_call(harness: Harness) -> None:
    h = harness
    h.engine.chunk = 2
    h.engine.free = [
        "Let me check.\n```json\n" + call("get_weather", {"city": "Paris"}) + "\n```\n" * 20
    ]
    h.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER, ADD])  # tool_choice defaults to auto
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    [tc] = choice["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == PARIS  # from the constrained call

    free, constrained = (
        h.engine.completions(constrained=False),
        h.engine.completions(constrained=True),
    )
    assert len(free) == 1 and len(constrained) >= 1
    base = free[0]["prompt"]
    assert base.endswith("<|im_start|>assistant\n")
    assert constrained[0]["prompt"] == base + "Let me check.\n" + TOOL_CALL_OPEN
    assert h.engine.streams_closed_early == 1  # the free generation was abandoned (aborted)
    assert h.metric("loopstack_auto_constraint_switches_total") == 1
    assert h.metric("loopstack_tool_requests_total", mode="auto") == 1


async def test_auto_mode_plain_text_is_content(harness: Harness) -> None:
    h = harness
    text = "Paris is sunny today. Use {braces} < freely and `code`.\n```python\nx = 1\n```"
    h.engine.free = [text]
    resp = await post_chat(h, tools=[WEATHER])
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["message"]["content"] == text
    assert not choice["message"].get("tool_calls")
    assert choice["finish_reason"] == "stop"
    assert h.engine.completions(constrained=True) == []
    assert h.metric("loopstack_auto_constraint_switches_total") == 0


async def test_auto_mode_streaming(harness: Harness) -> None:
    h = harness
    h.engine.chunk = 1
    h.engine.free = ["Checking.\n<tool_call>\n" + call("get_weather", {"city": "Rome"})]
    h.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER], stream=True)
    got = collect_stream(sse_events(resp.text))
    assert got["content"].strip() == "Checking."
    assert "<tool" not in got["content"]
    [c] = got["calls"]
    assert c["name"] == "get_weather" and json.loads(c["arguments"]) == PARIS
    assert got["finish"] == "tool_calls"

    h.engine.free = ["No call needed: it is {sunny} <3"]
    resp = await post_chat(h, tools=[WEATHER], stream=True)
    got = collect_stream(sse_events(resp.text))
    assert got["content"] == "No call needed: it is {sunny} <3"
    assert got["calls"] == [] and got["finish"] == "stop"


# --------------------------------------------------------------------------- validation
async def test_inexact_schema_output_is_retried_until_valid(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("set_even", {"n": 3}), call("set_even", {"n": 4})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", temperature=0.0)
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"n": 4}
    sent = h.engine.completions(constrained=True)
    assert len(sent) == 2
    assert sent[1]["temperature"] >= 0.7 and sent[1].get("seed") is not None
    assert h.metric("loopstack_tool_call_retries_total") == 1


async def test_inexact_schema_output_that_never_validates_is_a_502(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("set_even", {"n": 3})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required")
    assert_openai_error(resp, 502, type_="tool_call_validation_error")
    sent = h.engine.completions(constrained=True)
    assert len(sent) == MAX_ATTEMPTS
    assert len({b.get("seed") for b in sent}) == MAX_ATTEMPTS  # each retry samples anew
    assert h.metric("loopstack_tool_calls_total", mode="required", valid="true") == 0


async def test_streamed_inexact_schema_never_sends_invalid_arguments(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("set_even", {"n": 3})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", stream=True)
    events = sse_events(resp.text)
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[0]["type"] == "tool_call_validation_error"
    assert not any(
        ch["delta"].get("tool_calls") for e in events if "choices" in e for ch in e["choices"]
    )


async def test_streamed_inexact_schema_is_validated_before_it_is_sent(harness: Harness) -> None:
    h = harness
    h.engine.chunk = 2
    h.engine.constrained = [call("set_even", {"n": 3}), call("set_even", {"n": 8})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", stream=True)
    got = collect_stream(sse_events(resp.text))
    [c] = got["calls"]
    assert c["name"] == "set_even" and json.loads(c["arguments"]) == {"n": 8}
    assert got["finish"] == "tool_calls"
    assert len(h.engine.completions(constrained=True)) == 2


async def test_auto_mode_parallel_calls(harness: Harness) -> None:
    h = harness
    h.engine.free = ['{"name": "add", "arguments": {"a": 1, "b": 1}}']
    first = call("add", {"a": 1, "b": 1}) + "\n</tool_call>\n<tool_call>\n"
    h.engine.constrained = [first, call("get_weather", {"city": "Oslo"}) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER, ADD], stream=True)
    got = collect_stream(sse_events(resp.text))
    assert got["content"] == ""
    assert [c["name"] for c in got["calls"]] == ["add", "get_weather"]
    assert [json.loads(c["arguments"]) for c in got["calls"]] == [
        {"a": 1, "b": 1},
        {"city": "Oslo"},
    ]
    rounds = h.engine.completions(constrained=True)  # head, arguments, head, arguments
    assert len(rounds) == 4
    assert rounds[2]["prompt"] == rounds[0]["prompt"] + first


async def test_unconstrained_baseline_sends_no_grammar(harness: Harness) -> None:
    h = harness
    h.engine.free = [call("get_weather", {"city": "Oslo", "days": 99}) + "\n</tool_call>"]
    resp = await post_chat(
        h, tools=[WEATHER], tool_choice="required", loopstack={"constrained": False}
    )
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"city": "Oslo", "days": 99}
    assert h.engine.requests and all(
        "structured_outputs" not in b and "loopstack" not in b for _, b in h.engine.requests
    )

    h.engine.requests.clear()
    h.engine.free = ["Sure:\n```json\n" + call("add", {"a": 1, "b": 2}) + "\n```"]
    resp = await post_chat(h, tools=[ADD], loopstack={"constrained": False})
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert tc["function"]["name"] == "add"
    assert all("structured_outputs" not in b for _, b in h.engine.requests)

    h.engine.requests.clear()
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    resp = await post_chat(h, response_format=rf, loopstack={"constrained": False})
    assert resp.status_code == 200, resp.text
    [(_, body)] = h.engine.requests
    assert "structured_outputs" not in body


# --------------------------------------------------------------------------- ops endpoints
async def test_metrics_include_ours_and_the_engines(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS)]
    assert (await post_chat(h, tools=[WEATHER], tool_choice="required")).status_code == 200
    resp = await h.client.get("/metrics")
    assert resp.status_code == 200
    text = resp.text
    assert ENGINE_METRICS in text
    assert 'loopstack_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'loopstack_tool_requests_total{mode="required"} 1.0' in text
    assert "loopstack_schema_compile_seconds" in text


async def test_health_follows_the_engine(harness: Harness) -> None:
    resp = await harness.client.get("/health")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"
    harness.engine.is_healthy = False
    assert (await harness.client.get("/health")).status_code == 503


async def test_models_and_request_ids(harness: Harness) -> None:
    resp = await harness.client.get("/v1/models", headers={"x-request-id": "abc123"})
    assert resp.headers["x-request-id"] == "abc123"
    ids = [m["id"] for m in resp.json()["data"]]
    assert ids == [MODEL, "all-MiniLM-L6-v2"]
    assert len((await harness.client.get("/health")).headers["x-request-id"]) == 16


async def test_completions_pass_through(harness: Harness) -> None:
    resp = await harness.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 5}
    )
    assert resp.status_code == 200, resp.text
    [(path, body)] = harness.engine.requests
    assert path == "/v1/completions" and body["model"] == harness.engine.model_name
    assert body["prompt"] == "Once" and body["max_tokens"] == 5
