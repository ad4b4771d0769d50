"""POST /v1/messages and /v1/messages/count_tokens (Anthropic) over the real router, chat
service and constraint backend, with the scripted engine: the exact event order, each
tool_choice, the tool_result round trip, system folding, attribution stripping, max_tokens
lowered to the context, aliases, both auth headers and the error envelope."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from loopstack.serving.constraint.envelope import TOOL_CALL_OPEN
from loopstack.serving.exceptions import UpstreamError
from loopstack.serving.http import pipeline
from loopstack.serving.http.messages.encoder import MessagesEncoder
from loopstack.serving.http.service import Turn
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import ADD as CHAT_ADD
from tests.unit.serving.serving_helpers import PARIS, call
from tests.unit.serving.serving_helpers import WEATHER as CHAT_WEATHER


def _anthropic(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat helper's tool as the Messages API declares it (``input_schema``)."""
    fn = tool["function"]
    out = {"name": fn["name"], "input_schema": fn["parameters"]}
    return {**out, "description": fn["description"]} if "description" in fn else out


WEATHER = _anthropic(CHAT_WEATHER)
ADD = _anthropic(CHAT_ADD)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=sdk-cli; cch={};"


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": USER, **kw}


async def post(h: Harness, headers: dict[str, str] | None = None, **kw: Any) -> Any:
    return await h.client.post("/v1/messages?beta=true", json=body(**kw), headers=headers)


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of an Anthropic SSE body; each event's name matches its type."""
    out = []
    for raw in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in raw.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"], raw
        out.append((lines["event"], data))
    return out


def assert_anthropic_error(resp: Any, status: int, type_: str) -> str:
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert data["type"] == "error" and set(data) == {"type", "error"}, data
    assert data["error"]["type"] == type_, data
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    return str(data["error"]["message"])


def last_prompt(h: Harness) -> str:
    return str(h.engine.completions()[-1]["prompt"])


# --------------------------------------------------------------------------- streaming
async def test_streamed_text_has_the_exact_event_order(harness: Harness) -> None:
    h = harness
    h.engine.chat_content = "Paris is sunny today."
    resp = await post(h, stream=True, headers={"anthropic-beta": "fine-grained-tool-streaming"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    got = events(resp.text)
    names = [n for n, _ in got]
    deltas = names.count("content_block_delta")
    assert deltas >= 2
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = got[0][1]["message"]
    assert start["content"] == [] and start["role"] == "assistant" and start["model"] == MODEL
    assert start["usage"]["input_tokens"] > 0 and start["usage"]["output_tokens"] == 0
    assert got[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta")
    assert text == "Paris is sunny today."
    assert got[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert "output_tokens" in got[-2][1]["usage"]
    [(path, sent)] = h.engine.requests
    assert path == "/v1/chat/completions" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
async def test_streamed_tool_use_blocks(harness: Harness, choice: dict[str, Any]) -> None:
    h = harness
    h.engine.chunk = 4
    h.engine.cached_tokens = 3
    h.engine.constrained = [call("get_weather", PARIS)]
    resp = await post(h, stream=True, tools=[WEATHER, ADD], tool_choice=choice)
    assert resp.status_code == 200, resp.text
    got = events(resp.text)
    names = [n for n, _ in got]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    block = got[1][1]["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather"
    assert block["input"] == {} and block["id"]
    partial = "".join(d["delta"]["partial_json"] for n, d in got if n == "content_block_delta")
    assert all(d["delta"]["type"] == "input_json_delta" for n, d in got[2:-3])
    assert json.loads(partial) == PARIS
    assert got[-2][1]["delta"]["stop_reason"] == "tool_use"
    usage = got[-2][1]["usage"]
    assert usage["cache_read_input_tokens"] == 3
    assert usage["input_tokens"] + 3 == got[0][1]["message"]["usage"]["input_tokens"]
    assert last_prompt(h).endswith(TOOL_CALL_OPEN)  # any / tool = a call is certain
    if choice["type"] == "tool":
        assert '"add"' not in json.dumps(h.engine.completions()[-1]["structured_outputs"])


async def test_streamed_auto_text_then_call(harness: Harness) -> None:
    h = harness
    h.engine.chunk = 3
    h.engine.constrained = ["Let me check.\n<tool_call>\n" + call("get_weather", PARIS)]
    resp = await post(h, stream=True, tools=[WEATHER], tool_choice={"type": "auto"})
    got = events(resp.text)
    starts = [d["content_block"]["type"] for n, d in got if n == "content_block_start"]
    assert starts == ["text", "tool_use"]
    stops = [d["index"] for n, d in got if n == "content_block_stop"]
    assert stops == [0, 1]
    # a block stops before the next starts
    names = [n for n, _ in got]
    second = [i for i, n in enumerate(names) if n == "content_block_start"][1]
    assert names[second - 1] == "content_block_stop"
    text = "".join(d["delta"].get("text", "") for n, d in got if n == "content_block_delta")
    assert text.strip() == "Let me check."
    assert got[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_pings_while_the_prompt_prefills(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    monkeypatch.setattr(pipeline, "KEEPALIVE_S", 0.05)
    monkeypatch.setattr(pipeline, "FIRST_EVENT_WAIT_S", 0.05)
    h.engine.gate = asyncio.Event()
    h.engine.chat_content = "ok"
    task = asyncio.create_task(post(h, stream=True))
    await h.engine.entered.wait()
    await asyncio.sleep(0.3)  # the engine "prefills"
    h.engine.gate.set()
    resp = await task
    names = [n for n, _ in events(resp.text)]
    assert names[0] == "message_start"
    first_block = names.index("content_block_start")
    assert names[1:first_block] and set(names[1:first_block]) == {"ping"}
    assert names[-1] == "message_stop"


# --------------------------------------------------------------------------- whole messages
async def test_each_tool_choice_whole(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("add", {"a": 2, "b": 40})]
    for choice in ({"type": "any"}, {"type": "tool", "name": "add"}):
        resp = await post(h, tools=[WEATHER, ADD], tool_choice=choice)
        assert resp.status_code == 200, resp.text
        msg = resp.json()
        assert msg["type"] == "message" and msg["role"] == "assistant" and msg["model"] == MODEL
        [use] = msg["content"]
        assert use["type"] == "tool_use" and use["name"] == "add"
        assert use["input"] == {"a": 2, "b": 40}
        assert msg["stop_reason"] == "tool_use" and msg["stop_sequence"] is None
        assert msg["usage"]["input_tokens"] > 0 and msg["usage"]["output_tokens"] > 0
        assert last_prompt(h).endswith(TOOL_CALL_OPEN)
    # auto: the model answers in text
    h.engine.constrained = ["It is sunny in Paris."]
    msg = (await post(h, tools=[WEATHER], tool_choice={"type": "auto"})).json()
    assert msg["content"] == [{"type": "text", "text": "It is sunny in Paris."}]
    assert msg["stop_reason"] == "end_turn"
    assert not last_prompt(h).endswith(TOOL_CALL_OPEN)
    # none: no tool path, the engine's own chat endpoint, told none
    h.engine.chat_content = "No tools."
    msg = (await post(h, tools=[WEATHER], tool_choice={"type": "none"})).json()
    assert msg["content"] == [{"type": "text", "text": "No tools."}]
    path, sent = h.engine.requests[-1]
    assert path == "/v1/chat/completions" and sent["tool_choice"] == "none"
    # disable_parallel_tool_use reaches the plan
    h.engine.constrained = [call("add", {"a": 1, "b": 1})]
    choice = {"type": "any", "disable_parallel_tool_use": True}
    assert (await post(h, tools=[ADD], tool_choice=choice)).status_code == 200


async def test_tool_result_round_trip(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS)]
    first = (await post(h, tools=[WEATHER], tool_choice={"type": "any"})).json()
    [use] = first["content"]
    history = [
        *USER,
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, use]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use["id"],
                    "content": [{"type": "text", "text": "Sunny, 24 C"}],
                },
                {"type": "text", "text": "And tell me briefly."},
            ],
        },
    ]
    h.engine.constrained = ["It is sunny, 24 C."]
    resp = await post(h, messages=history, tools=[WEATHER])
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"][0]["text"] == "It is sunny, 24 C."
    prompt = last_prompt(h)
    assert "<|im_start|>tool\nSunny, 24 C<|im_end|>" in prompt
    assert '"arguments": {"city": "Paris {\\"x\\"}", "days": 3}' in prompt  # the call, replayed
    assert "hmm" not in prompt  # thinking dropped
    assert prompt.index("Sunny, 24 C") < prompt.index("And tell me briefly.")
    # an error result is marked as one; a string content works too
    history[2]["content"] = [
        {"type": "tool_result", "tool_use_id": use["id"], "content": "boom", "is_error": True}
    ]
    assert (await post(h, messages=history, tools=[WEATHER])).status_code == 200
    assert "<|im_start|>tool\n[tool error] boom<|im_end|>" in last_prompt(h)


async def test_system_blocks_and_system_entries_are_folded_attribution_stripped(
    harness: Harness,
) -> None:
    h = harness
    sent = []
    for cch in ("a1b2c", "ffff0"):
        system = [
            {"type": "text", "text": BILLING.format(cch)},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "x"}},
        ]
        messages = [*USER, {"role": "system", "content": "Reminder: be brief."}]
        resp = await post(h, system=system, messages=messages, thinking={"type": "disabled"})
        assert resp.status_code == 200, resp.text
        sent.append(h.engine.requests[-1][1]["messages"])
    assert sent[0] == sent[1]  # the prompt does not change with the attribution line
    system_msg, user = sent[0]
    assert system_msg == {
        "role": "system",
        "content": "You are a coding agent.\n\nReminder: be brief.",
    }
    assert user == {"role": "user", "content": USER[0]["content"]}
    # a string system prompt with the line inside it
    await post(h, system=f"{BILLING.format('x')}\nBe kind.")
    assert h.engine.requests[-1][1]["messages"][0] == {"role": "system", "content": "Be kind."}


async def test_stop_sequences_sampling_metadata_reach_the_engine(harness: Harness) -> None:
    h = harness
    resp = await post(
        h, stop_sequences=["END"], temperature=0.3, top_p=0.9, top_k=20,
        metadata={"user_id": "u-1"},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    sent = h.engine.requests[-1][1]
    assert sent["stop"] == ["END"] and sent["temperature"] == 0.3 and sent["top_p"] == 0.9
    assert sent["top_k"] == 20
    vllm = {
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 4}},
    }  # fmt: skip
    msg = await MessagesEncoder(model="m", stop_sequences=["END"]).whole(Turn(passed=vllm))
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "END"
    assert msg["usage"]["input_tokens"] == 6 and msg["usage"]["cache_read_input_tokens"] == 4
    vllm["choices"][0]["finish_reason"] = "length"
    cut = await MessagesEncoder(model="m", stop_sequences=None).whole(Turn(passed=vllm))
    assert cut["stop_reason"] == "max_tokens"


async def test_images_become_a_note(harness: Harness) -> None:
    h = harness
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]
    resp = await post(h, messages=messages)
    assert resp.status_code == 200, resp.text
    assert "image" in resp.headers["x-loopstack-note"]
    content = h.engine.requests[-1][1]["messages"][0]["content"]
    assert content.startswith("What is it?\n[an image was attached here")


# --------------------------------------------------------------------------- limits, names
async def test_max_tokens_is_lowered_to_the_context(make_harness: Any) -> None:
    h = make_harness(max_model_len=100)
    resp = await post(h, max_tokens=32000)
    assert resp.status_code == 200, resp.text
    asked, given = resp.headers["x-loopstack-max-tokens-clamped"].split("->")
    assert asked == "32000" and 0 < int(given) < 100
    assert h.engine.requests[-1][1]["max_tokens"] == int(given)
    # the tool path too, streamed
    h.engine.constrained = [call("get_weather", {"city": "Rome"})]
    resp = await post(h, max_tokens=32000, tools=[WEATHER], tool_choice={"type": "any"},
                      stream=True)  # fmt: skip
    assert resp.status_code == 200, resp.text
    assert "x-loopstack-max-tokens-clamped" in resp.headers
    assert events(resp.text)[-1][0] == "message_stop"
    # a prompt that leaves nothing: a clear 400 in the Anthropic shape
    long = [{"role": "user", "content": "word " * 200}]
    message = assert_anthropic_error(await post(h, messages=long), 400, "invalid_request_error")
    assert "context length" in message


async def test_chat_and_completions_lower_max_tokens_too(make_harness: Any) -> None:
    h = make_harness(max_model_len=512)
    for key in ("max_tokens", "max_completion_tokens"):
        resp = await h.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, key: 100_000},
        )
        assert resp.status_code == 200, resp.text
        asked, given = resp.headers["x-loopstack-max-tokens-clamped"].split("->")
        assert asked == "100000" and int(given) < 512
        assert h.engine.requests[-1][1]["max_tokens"] == int(given)
    resp = await h.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 5000}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-loopstack-max-tokens-clamped"] == "5000->509"
    assert h.engine.requests[-1][1]["max_tokens"] == 509
    # a limit that fits is left alone and not announced
    resp = await h.client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER,
                                                              "max_tokens": 50})  # fmt: skip
    assert "x-loopstack-max-tokens-clamped" not in resp.headers
    assert h.engine.requests[-1][1]["max_tokens"] == 50


async def test_model_aliases_on_every_api(harness: Harness) -> None:
    h = harness
    h.state.model_aliases = {"claude-*": MODEL, "gpt-5": MODEL}
    assert (await post(h, model="claude-haiku-4-5-20251001")).json()["model"] == (
        "claude-haiku-4-5-20251001"
    )
    chat = await h.client.post("/v1/chat/completions", json={"model": "gpt-5", "messages": USER})
    assert chat.status_code == 200, chat.text
    assert h.engine.requests[-1][1]["model"] == h.engine.model_name
    comp = await h.client.post("/v1/completions", json={"model": "claude-x", "prompt": "hi"})
    assert comp.status_code == 200, comp.text
    count = await h.client.post("/v1/messages/count_tokens", json={"model": "claude-opus-4",
                                                                     "messages": USER})  # fmt: skip
    assert count.status_code == 200, count.text
    # not served, not mapped: 404 that lists what is served, in each API's own shape
    message = assert_anthropic_error(await post(h, model="other"), 404, "not_found_error")
    assert f"`{MODEL}`" in message and "LOOPSTACK_MODEL_ALIASES" in message
    resp = await h.client.post("/v1/chat/completions", json={"model": "o", "messages": USER})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert f"`{MODEL}`" in resp.json()["error"]["message"]
    h.state.model_aliases = {"*": MODEL}
    assert (await post(h, model="anything")).status_code == 200


# --------------------------------------------------------------------------- auth, errors
async def test_both_auth_headers(make_harness: Any) -> None:
    h = make_harness(api_key="sekret")
    for headers in ({"x-api-key": "sekret"}, {"authorization": "Bearer sekret"}):
        resp = await post(h, headers=headers)
        assert resp.status_code == 200, resp.text
        count = await h.client.post("/v1/messages/count_tokens", json=body(), headers=headers)
        assert count.status_code == 200, count.text
    for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"},
                    {"x-api-key": ""}):  # fmt: skip
        assert_anthropic_error(await post(h, headers=headers), 401, "authentication_error")
    # the OpenAI routes keep their own error shape, and take x-api-key too
    resp = await h.client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    resp = await h.client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER},
                               headers={"x-api-key": "sekret"})  # fmt: skip
    assert resp.status_code == 200


MALFORMED: list[Any] = [
    b"{not json",
    b"[]",
    b'"text"',
    {"model": MODEL, "messages": USER},  # no max_tokens
    {"model": MODEL, "max_tokens": 0, "messages": USER},
    {"model": MODEL, "max_tokens": 10, "messages": "hi"},
    {"model": MODEL, "max_tokens": 10, "messages": []},
    {"model": MODEL, "max_tokens": 10, "messages": [{"role": "bot", "content": "x"}]},
    {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": 5}]},
    {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [{}]}]},
    body(tool_choice={"type": "tool"}, tools=[WEATHER]),
    body(tool_choice={"type": "any"}),
    body(tool_choice={"type": "sometimes"}, tools=[WEATHER]),
    body(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]),
    body(tools=[{"input_schema": {}}]),
    body(tools=[WEATHER, WEATHER]),
    body(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
    body(temperature=5),
    body(system=5),
    body(stop_sequences="END"),
    body(messages=[{"role": "system", "content": "only a system entry"}]),
    b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": NaN}]}',
    b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "\\ud800"}]}',
]


@pytest.mark.parametrize("bad", MALFORMED)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_malformed_bodies_are_4xx_in_the_anthropic_shape(
    harness: Harness, path: str, bad: Any
) -> None:
    h = harness
    if isinstance(bad, bytes):
        resp = await h.client.post(path, content=bad, headers={"content-type": "application/json"})
    else:
        resp = await h.client.post(path, json=bad)
    if (
        path.endswith("count_tokens")
        and isinstance(bad, dict)
        and ("max_tokens" not in bad or bad["max_tokens"] == 0)
    ):
        if "max_tokens" not in bad:  # count_tokens takes no max_tokens
            assert resp.status_code == 200, resp.text
            return
    assert 400 <= resp.status_code < 500, resp.text
    assert_anthropic_error(resp, resp.status_code, "invalid_request_error")
    assert h.engine.requests == []


async def test_unknown_method_and_trace_id(harness: Harness) -> None:
    resp = await harness.client.get("/v1/messages")
    assert_anthropic_error(resp, 405, "invalid_request_error")
    resp = await post(harness, headers={"x-request-id": "trace-123"})
    assert resp.headers["x-request-id"] == "trace-123"
    assert harness.metric("loopstack_requests_total", route="/v1/messages", status="200") == 1


async def test_count_tokens_counts_the_rendered_prompt(harness: Harness) -> None:
    h = harness
    resp = await h.client.post("/v1/messages/count_tokens", json=body(tools=[WEATHER]))
    assert resp.status_code == 200, resp.text
    n = resp.json()
    assert set(n) == {"input_tokens"}
    fn = {"name": "get_weather", "description": WEATHER["description"]}
    tools = [{"type": "function", "function": {**fn, "parameters": WEATHER["input_schema"]}}]
    expected = h.prompts.count_tokens(h.prompts.render(USER, tools))
    assert n["input_tokens"] == expected
    system = [{"type": "text", "text": BILLING.format("z")}, {"type": "text", "text": "Be kind."}]
    more = await h.client.post("/v1/messages/count_tokens", json=body(system=system))
    assert more.json()["input_tokens"] == h.prompts.count_tokens(
        h.prompts.render([{"role": "system", "content": "Be kind."}, *USER], None)
    )
    assert h.engine.requests == []  # counting generates nothing


async def test_an_engine_failure_mid_stream_is_an_error_event_and_frees_the_slot(
    make_harness: Any,
) -> None:
    h = make_harness(max_running=1)
    h.engine.fail = (500, {"error": {"message": "engine fell over"}})
    resp = await post(h, stream=True, tools=[WEATHER], tool_choice={"type": "any"})
    assert resp.status_code == 200  # the events had begun
    got = events(resp.text)
    assert got[0][0] == "message_start"
    name, data = got[-1]
    assert name == "error" and data["error"]["type"] == "api_error", got
    assert "message_stop" not in [n for n, _ in got]
    h.engine.fail = None
    h.engine.constrained = [call("get_weather", PARIS)]
    # the one admission slot is free again
    again = await asyncio.wait_for(post(h, tools=[WEATHER], tool_choice={"type": "any"}), 10)
    assert again.status_code == 200, again.text


async def test_an_engine_error_before_the_first_event_is_an_http_error(harness: Harness) -> None:
    h = harness
    # the pass-through path surfaces the engine's answer before any event: an HTTP 4xx
    original = h.engine._stream

    async def failing(path: str, body: dict[str, Any]) -> Any:
        raise UpstreamError(400, {"error": {"message": "prompt too long for the engine"}})
        yield b""  # pragma: no cover

    h.engine._stream = failing  # type: ignore[method-assign]
    try:
        resp = await post(h, stream=True)
    finally:
        h.engine._stream = original  # type: ignore[method-assign]
    message = assert_anthropic_error(resp, 400, "invalid_request_error")
    assert "too long" in message


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_name_outside_latin_1_is_no_500(harness: Harness, stream: bool) -> None:
    """The fuzz found it: a server tool named in Chinese (or any non-latin-1 text) is skipped
    with a note, and the note header could not be encoded (500). Headers now carry it
    escaped."""
    tools = [{"name": "网页搜索\U0010b780", "type": "web_search_20250305"}]
    resp = await post(harness, tools=tools, stream=stream)
    assert resp.status_code == 200, resp.text
    note = resp.headers["x-loopstack-note"]
    assert "skipped" in note and "\\u7f51" in note and note.isascii()


async def test_the_abstention_rule_takes_its_room_from_the_completion(make_harness: Any) -> None:
    """The server's rule is added to the system message after `max_tokens` was fitted to the
    context: Claude Code's first request (max_tokens 32000) was refused by 49 tokens."""
    from loopstack.serving.selection.defaults import SelectionDefaults

    h = make_harness(max_model_len=400)
    h.chat.selection = SelectionDefaults(abstain=True)
    h.engine.constrained = ["It is sunny."]
    resp = await post(h, max_tokens=32000, tools=[WEATHER], stream=True)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-loopstack-selection"] == "server defaults: abstain"
    sent = h.engine.requests[-1][1]
    assert "max_tokens" in sent and sent["max_tokens"] < 400
