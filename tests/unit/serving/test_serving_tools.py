"""Tool calls through the router and ChatService over a scripted engine: the outlines path's
own behaviour (`outlines_harness`: regexes, two requests per call, auto by watching text),
and what every backend must show (`each_backend`); the default backend's one-request turns
are in test_serving_turn.py."""

from __future__ import annotations

import json
import re

from loopstack.serving.http.service import MAX_ATTEMPTS
from loopstack.serving.prompt import TOOL_CALL_OPEN
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import (
    ADD,
    EVEN,
    PARIS,
    WEATHER,
    assert_openai_error,
    call,
    collect_stream,
    post_chat,
    sse_events,
)


async def test_required_mode_sends_the_regex_and_returns_tool_calls(
    outlines_harness: Harness,
) -> None:
    h = outlines_harness
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


async def test_named_tool_choice_constrains_to_that_tool(outlines_harness: Harness) -> None:
    h = outlines_harness
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


async def test_parallel_calls_are_all_returned(outlines_harness: Harness) -> None:
    h = outlines_harness
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


async def test_required_mode_streams_the_same_arguments(each_backend: Harness) -> None:
    h = each_backend
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


async def test_response_format_schema_becomes_a_regex(outlines_harness: Harness) -> None:
    h = outlines_harness
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
async def test_auto_mode_switches_to_a_constrained_call(outlines_harness: Harness) -> None:
    h = outlines_harness
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


async def test_auto_mode_plain_text_is_content(outlines_harness: Harness) -> None:
    h = outlines_harness
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


async def test_auto_mode_streaming(outlines_harness: Harness) -> None:
    h = outlines_harness
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
async def test_inexact_schema_output_is_retried_until_valid(each_backend: Harness) -> None:
    h = each_backend
    h.engine.constrained = [call("set_even", {"n": 3}), call("set_even", {"n": 4})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", temperature=0.0)
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"n": 4}
    sent = h.engine.completions(constrained=True)
    assert len(sent) == 2
    assert sent[1]["temperature"] >= 0.7 and sent[1].get("seed") is not None
    assert h.metric("loopstack_tool_call_retries_total") == 1


async def test_inexact_schema_output_that_never_validates_is_a_502(each_backend: Harness) -> None:
    h = each_backend
    h.engine.constrained = [call("set_even", {"n": 3})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required")
    assert_openai_error(resp, 502, type_="tool_call_validation_error")
    sent = h.engine.completions(constrained=True)
    assert len(sent) == MAX_ATTEMPTS
    assert len({b.get("seed") for b in sent}) == MAX_ATTEMPTS  # each retry samples anew
    assert h.metric("loopstack_tool_calls_total", mode="required", valid="true") == 0


async def test_streamed_inexact_schema_never_sends_invalid_arguments(each_backend: Harness) -> None:
    h = each_backend
    h.engine.constrained = [call("set_even", {"n": 3})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", stream=True)
    events = sse_events(resp.text)
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[0]["type"] == "tool_call_validation_error"
    assert not any(
        ch["delta"].get("tool_calls") for e in events if "choices" in e for ch in e["choices"]
    )


async def test_streamed_inexact_schema_is_validated_before_it_is_sent(
    each_backend: Harness,
) -> None:
    h = each_backend
    h.engine.chunk = 2
    h.engine.constrained = [call("set_even", {"n": 3}), call("set_even", {"n": 8})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required", stream=True)
    got = collect_stream(sse_events(resp.text))
    [c] = got["calls"]
    assert c["name"] == "set_even" and json.loads(c["arguments"]) == {"n": 8}
    assert got["finish"] == "tool_calls"
    assert len(h.engine.completions(constrained=True)) == 2


async def test_auto_mode_parallel_calls(outlines_harness: Harness) -> None:
    h = outlines_harness
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
