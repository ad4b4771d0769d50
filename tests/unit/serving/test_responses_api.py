"""POST /v1/responses over the real ChatService with the scripted engine: the translation
both ways, the exact streamed event order, every tool_choice, custom tools, skipped tool
types, text.format, errors in the OpenAI shape, keep-alive while the engine is silent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from loopstack.serving.http import pipeline
from tests.unit.serving.responses_helpers import (
    APPLY_PATCH,
    FN_WEATHER,
    PATCH,
    body,
    create,
    engine_messages,
    events,
    kinds,
    squash,
)
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import PARIS, assert_openai_error, call

pytestmark = pytest.mark.asyncio

TEXT_EVENTS = [
    "created",
    "in_progress",
    "output_item.added",
    "content_part.added",
    "output_text.delta*",
    "output_text.done",
    "content_part.done",
    "output_item.done",
    "completed",
]
CALL_EVENTS = [
    "output_item.added",
    "function_call_arguments.delta*",
    "function_call_arguments.done",
    "output_item.done",
]


# --------------------------------------------------------------------------- whole responses
async def test_text_answer_is_a_whole_response_object(harness: Harness) -> None:
    harness.engine.chat_content = "Sunny, 21 C."
    resp = await create(harness, instructions="Answer briefly.", max_output_tokens=50)
    assert resp.status_code == 200, resp.text
    r = resp.json()
    assert r["object"] == "response" and r["id"].startswith("resp_")
    assert r["status"] == "completed" and r["model"] == MODEL
    [msg] = r["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"] == [
        {"type": "output_text", "text": "Sunny, 21 C.", "annotations": [], "logprobs": []}
    ]
    assert r["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    }
    path, sent = harness.engine.requests[-1]
    assert path == "/v1/chat/completions" and sent["max_tokens"] == 50
    assert sent["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert sent["messages"][1]["content"] == "What is the weather in Paris?"


async def test_function_call_comes_back_as_a_function_call_item(harness: Harness) -> None:
    harness.engine.constrained = [call("get_weather", PARIS)]
    resp = await create(harness, tools=[FN_WEATHER])
    assert resp.status_code == 200, resp.text
    [item] = resp.json()["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    assert json.loads(item["arguments"]) == PARIS and item["status"] == "completed"


async def test_max_output_tokens_cut_is_incomplete(harness: Harness) -> None:
    harness.engine.constrained = ["I think"]
    harness.engine.finish_reason = "length"
    resp = await create(harness, tools=[FN_WEATHER], max_output_tokens=2)
    r = resp.json()
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}


# --------------------------------------------------------------------------- streamed
async def test_streamed_text_follows_the_event_order(harness: Harness) -> None:
    harness.engine.chat_content = "Sunny and warm."
    resp = await create(harness, stream=True)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    evs = events(resp.text)
    assert squash(kinds(evs)) == TEXT_EVENTS
    assert evs[0]["response"]["output"] == [] and evs[0]["response"]["status"] == "in_progress"
    deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
    assert all(e["logprobs"] == [] for e in deltas) and len(deltas) > 1
    assert "".join(e["delta"] for e in deltas) == "Sunny and warm."
    final = evs[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Sunny and warm."
    assert (
        final["usage"]["total_tokens"]
        == final["usage"]["input_tokens"] + final["usage"]["output_tokens"]
    )
    # every event of an item names the index its output_item.added gave it
    assert {e["output_index"] for e in evs[2:-1]} == {0}


async def test_streamed_text_then_call_follows_the_event_order(harness: Harness) -> None:
    harness.engine.cached_tokens = 4
    harness.engine.constrained = ["Let me check. " + call("get_weather", PARIS)]
    resp = await create(harness, stream=True, tools=[FN_WEATHER])
    evs = events(resp.text)
    assert squash(kinds(evs)) == [*TEXT_EVENTS[:-1], *CALL_EVENTS, "completed"]
    added = [e for e in evs if e["type"] == "response.output_item.added"]
    assert [a["output_index"] for a in added] == [0, 1]
    assert added[1]["item"]["arguments"] == "" and added[1]["item"]["status"] == "in_progress"
    done = [e for e in evs if e["type"] == "response.output_item.done"][-1]["item"]
    assert done["type"] == "function_call" and json.loads(done["arguments"]) == PARIS
    args = "".join(e["delta"] for e in evs if e["type"].endswith("arguments.delta"))
    assert args == done["arguments"]
    final = evs[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 4


async def test_streamed_call_alone_opens_no_message(harness: Harness) -> None:
    harness.engine.constrained = ["\n" + call("get_weather", PARIS)]
    evs = events((await create(harness, stream=True, tools=[FN_WEATHER])).text)
    assert squash(kinds(evs)) == ["created", "in_progress", *CALL_EVENTS, "completed"]


async def test_streamed_cut_ends_with_response_incomplete(harness: Harness) -> None:
    harness.engine.constrained = ["I think"]
    harness.engine.finish_reason = "length"
    evs = events((await create(harness, stream=True, tools=[FN_WEATHER])).text)
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_engine_failure_mid_stream_is_response_failed(harness: Harness) -> None:
    harness.engine.fail = (400, {"error": {"message": "bad grammar"}})
    resp = await create(harness, stream=True, tools=[FN_WEATHER])
    assert resp.status_code == 200
    evs = events(resp.text)
    assert kinds(evs) == ["created", "in_progress", "failed"]
    failed = evs[-1]["response"]
    assert failed["status"] == "failed" and "bad grammar" in failed["error"]["message"]


async def test_keep_alive_while_the_engine_is_silent(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "KEEPALIVE_S", 0.05)
    harness.engine.gate = asyncio.Event()
    harness.engine.constrained = [call("get_weather", PARIS)]

    async def release() -> None:
        await harness.engine.entered.wait()  # held from the engine on, however slow the box
        await asyncio.sleep(0.4)
        assert harness.engine.gate is not None
        harness.engine.gate.set()

    opener = asyncio.create_task(release())
    resp = await create(harness, stream=True, tools=[FN_WEATHER])
    await opener
    names = kinds(events(resp.text))
    assert names[:2] == ["created", "in_progress"]
    assert names.count("in_progress") >= 4, names  # repeated while nothing came
    assert names[-1] == "completed"


# --------------------------------------------------------------------------- tool_choice
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
async def test_required_and_named_force_a_call(harness: Harness, choice: Any) -> None:
    harness.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await create(harness, tools=[FN_WEATHER], tool_choice=choice)
    assert resp.status_code == 200, resp.text
    assert [i["type"] for i in resp.json()["output"]] == ["function_call"]
    assert engine_messages(harness).endswith("<tool_call>\n")  # the call is forced
    assert resp.json()["tool_choice"] == choice


async def test_tool_choice_none_answers_in_text(harness: Harness) -> None:
    harness.engine.chat_content = "No tools needed."
    resp = await create(harness, tools=[FN_WEATHER], tool_choice="none")
    assert resp.json()["output"][0]["content"][0]["text"] == "No tools needed."
    path, sent = harness.engine.requests[-1]
    assert path == "/v1/chat/completions" and sent.get("tool_choice") == "none"


async def test_auto_lets_the_model_answer_in_text(harness: Harness) -> None:
    harness.engine.constrained = ["It is sunny."]
    resp = await create(harness, tools=[FN_WEATHER], tool_choice="auto")
    assert [i["type"] for i in resp.json()["output"]] == ["message"]
    assert not engine_messages(harness).endswith("<tool_call>\n")


async def test_allowed_tools_narrows_then_applies_its_mode(harness: Harness) -> None:
    other = {**FN_WEATHER, "name": "get_time"}
    harness.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}],
    }
    resp = await create(harness, tools=[FN_WEATHER, other], tool_choice=choice)
    assert resp.status_code == 200, resp.text
    prompt = engine_messages(harness)
    assert "get_time" not in prompt and prompt.endswith("<tool_call>\n")


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "function", "name": "nope"},
        {"type": "web_search_preview"},
        {"type": "allowed_tools", "mode": "auto", "tools": []},
    ],
)
async def test_tool_choice_naming_no_served_tool_is_400(harness: Harness, choice: Any) -> None:
    resp = await create(harness, tools=[FN_WEATHER], tool_choice=choice)
    assert assert_openai_error(resp, 400)["param"] == "tool_choice"


async def test_parallel_tool_calls_false_reaches_the_plan(harness: Harness) -> None:
    harness.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await create(
        harness, tools=[FN_WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    assert resp.json()["parallel_tool_calls"] is False
    grammar = harness.engine.completions(constrained=True)[-1]["structured_outputs"]["grammar"]
    assert "call)*" not in grammar  # no second call admitted


# --------------------------------------------------------------------------- custom tools
async def test_custom_tool_call_comes_back_as_custom_tool_call(harness: Harness) -> None:
    harness.engine.constrained = [call("apply_patch", {"input": PATCH})]
    resp = await create(harness, tools=[APPLY_PATCH, FN_WEATHER])
    assert resp.status_code == 200, resp.text
    r = resp.json()
    [item] = r["output"]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert item["input"] == PATCH and "arguments" not in item
    assert "loopstack" not in r  # nothing skipped, the grammar enforced
    # the model saw it as a tool of one string argument; the turn's grammar holds that
    # string to the tool's Lark grammar, JSON-escaped
    assert '"input": {"type": "string"}' in engine_messages(harness)
    grammar = harness.engine.completions(constrained=True)[-1]["structured_outputs"]["grammar"]
    assert '"{\\"input\\": \\""' in grammar and '"*** Begin Patch"' in grammar


async def test_custom_tool_grammar_the_backend_cannot_hold_is_free_with_a_note(
    harness: Harness,
) -> None:
    harness.engine.constrained = [call("apply_patch", {"input": "anything"})]
    fmt = {"type": "grammar", "syntax": "lark", "definition": 'start: "a"i\n'}
    resp = await create(harness, tools=[{**APPLY_PATCH, "format": fmt}])
    assert resp.status_code == 200, resp.text
    [note] = resp.json()["loopstack"]["notes"]
    assert "grammar not enforced" in note and "case-insensitive" in note
    assert resp.json()["output"][0]["input"] == "anything"


async def test_streamed_custom_call_is_added_then_done_with_its_input(harness: Harness) -> None:
    harness.engine.constrained = [call("apply_patch", {"input": PATCH})]
    evs = events((await create(harness, stream=True, tools=[APPLY_PATCH])).text)
    assert kinds(evs) == [
        "created",
        "in_progress",
        "output_item.added",
        "output_item.done",
        "completed",
    ]
    assert evs[2]["item"]["type"] == "custom_tool_call" and evs[2]["item"]["input"] == ""
    assert evs[3]["item"]["input"] == PATCH and evs[3]["item"]["status"] == "completed"
    assert evs[-1]["response"]["output"] == [evs[3]["item"]]


async def test_named_custom_tool(harness: Harness) -> None:
    harness.engine.constrained = [call("apply_patch", {"input": PATCH}) + "\n</tool_call>"]
    resp = await create(
        harness, tools=[APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"}
    )
    assert resp.json()["output"][0]["input"] == PATCH


# --------------------------------------------------------------------------- skipped tools
async def test_hosted_and_unknown_tool_types_are_skipped_with_a_note(harness: Harness) -> None:
    harness.engine.constrained = [call("get_weather", PARIS)]
    tools = [
        {"type": "local_shell"},
        {"type": "web_search", "external_web_access": False},
        {"type": "namespace", "name": "mcp", "tools": []},
        FN_WEATHER,
        {"type": "image_generation"},
    ]
    resp = await create(harness, tools=tools)
    assert resp.status_code == 200, resp.text
    notes = resp.json()["loopstack"]["notes"]
    assert len(notes) == 4 and all("skipped" in n for n in notes)
    assert "local_shell" in resp.headers["x-loopstack-notes"]
    assert resp.json()["output"][0]["type"] == "function_call"


async def test_only_skipped_tools_is_a_plain_answer(harness: Harness) -> None:
    harness.engine.chat_content = "Hi."
    resp = await create(harness, tools=[{"type": "web_search"}])
    assert resp.status_code == 200
    assert resp.json()["output"][0]["content"][0]["text"] == "Hi."


# --------------------------------------------------------------------------- text.format
async def test_text_format_json_schema_is_response_format(harness: Harness) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "Answer", "schema": schema, "strict": True}
    resp = await create(harness, text={"format": fmt})
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["output"][0]["content"][0]["text"]) == {"answer": 42}
    assert resp.json()["text"]["format"]["name"] == "Answer"
    sent = harness.engine.requests[-1][1]
    assert "grammar" in sent["structured_outputs"]  # admitted by the constraint backend
    assert "response_format" not in sent


async def test_text_format_invalid_schema_is_400(harness: Harness) -> None:
    fmt = {"type": "json_schema", "name": "A", "schema": {"type": "nope"}}
    resp = await create(harness, text={"format": fmt})
    assert_openai_error(resp, 400)


# --------------------------------------------------------------------------- input items
async def test_codex_style_history_reaches_the_prompt(harness: Harness) -> None:
    harness.engine.constrained = ["Done."]
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "DEV RULES"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": None},
        {
            "type": "function_call",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
            "call_id": "call_1",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "RAINY"},
        {"type": "custom_tool_call", "name": "apply_patch", "input": PATCH, "call_id": "c2"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "PATCH APPLIED"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "EARLIER ANSWER"}],
        },
        {"role": "user", "content": "and now?"},
    ]
    resp = await create(
        harness,
        input=items,
        tools=[FN_WEATHER, APPLY_PATCH],
        instructions="SYSTEM",
        store=False,
        include=[],
        prompt_cache_key="k1",
        reasoning=None,
    )
    assert resp.status_code == 200, resp.text
    prompt = engine_messages(harness)
    order = [
        "SYSTEM",
        "DEV RULES",
        "fix",
        "Oslo",
        "RAINY",
        "Begin Patch",
        "PATCH APPLIED",
        "EARLIER ANSWER",
        "and now?",
    ]
    at = prompt.index("</tools>")  # each in turn, after the tool listing
    for text in order:
        at = prompt.index(text, at)
    assert "<|im_start|>tool\nRAINY" in prompt


async def test_agents_sdk_replays_its_own_output_items(harness: Harness) -> None:
    harness.engine.constrained = [call("get_weather", PARIS)]
    first = (await create(harness, tools=[FN_WEATHER], include=[])).json()
    replay = [
        {"role": "user", "content": "weather?"},
        *first["output"],
        {
            "type": "function_call_output",
            "call_id": first["output"][0]["call_id"],
            "output": "sunny",
        },
    ]
    harness.engine.constrained = ["It is sunny."]
    resp = await create(harness, input=replay, tools=[FN_WEATHER])
    assert resp.status_code == 200, resp.text
    assert resp.json()["output"][0]["content"][0]["text"] == "It is sunny."
    assert "sunny" in engine_messages(harness)


# --------------------------------------------------------------------------- errors
async def test_unknown_model_is_404_in_the_error_shape(harness: Harness) -> None:
    resp = await harness.client.post("/v1/responses", json=body(model="gpt-5"))
    assert assert_openai_error(resp, 404)["code"] == "model_not_found"


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "[]",
        '{"model": "test-model", "input": 3}',
        '{"model": "test-model", "input": [3]}',
        '{"model": "test-model", "input": [{"type": "message", "role": "wizard"}]}',
        '{"model": "test-model", "input": [{"type": "function_call", "arguments": "{}"}]}',
        '{"model": "test-model", "input": [{"type": "function_call_output", "output": "x"}]}',
        '{"model": "test-model", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}',
        '{"model": "test-model", "input": [{"role": "user", "content": 5}]}',
        '{"model": "test-model", "input": ""}',
        '{"model": "test-model", "input": "x", "tools": [{"type": "function"}]}',
        '{"model": "test-model", "input": "x", "tools": [{"type": "function", "name": "a b"}]}',
        '{"model": "test-model", "input": "x", "tools": [3]}',
        '{"model": "test-model", "input": "x", "tools": [{"type": "custom", "name": "c",'
        ' "format": {"type": "regex"}}]}',
        '{"model": "test-model", "input": "x", "tool_choice": "required"}',
        '{"model": "test-model", "input": "x", "tool_choice": "sometimes"}',
        '{"model": "test-model", "input": "x", "max_output_tokens": 0}',
        '{"model": "test-model", "input": "x", "temperature": 9}',
        '{"model": "test-model", "input": "x", "text": {"format": {"type": "json_schema"}}}',
        '{"model": "test-model", "input": "x", "text": {"format": {"type": "xml"}}}',
        '{"model": "test-model", "input": "x", "background": true}',
        '{"model": "test-model", "input": "x", "previous_response_id": "resp_nope"}',
        '{"model": "test-model", "input": "\\ud800"}',
        '{"model": "test-model", "input": "x", "metadata": {"a": 1e999}}',
    ],
)
async def test_malformed_bodies_are_4xx_never_5xx(harness: Harness, raw: str) -> None:
    harness.engine.chat_content = "ok"
    resp = await harness.client.post(
        "/v1/responses", content=raw, headers={"content-type": "application/json"}
    )
    assert 400 <= resp.status_code < 500, (raw, resp.status_code, resp.text)
    assert_openai_error(resp, resp.status_code)


async def test_random_item_shapes_never_5xx(harness: Harness) -> None:
    import random

    rng = random.Random(43)
    harness.engine.chat_content = "ok"
    harness.engine.constrained = ["ok"]
    values: list[Any] = [None, 1, "x", [], {}, [{}], {"type": "input_text"}, True, "call_1"]
    keys = ["type", "role", "content", "call_id", "name", "arguments", "output", "input", "id"]
    types = [
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "item_reference",
        "mystery",
        None,
    ]
    choices: list[Any] = [
        None,
        "auto",
        "none",
        {"type": "function", "name": {}},
        {"type": "allowed_tools", "tools": [{"name": []}]},
        {"type": 3},
    ]
    for _ in range(200):
        item = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 5))}
        item["type"] = rng.choice(types)
        if rng.random() < 0.5:
            item["role"] = rng.choice(["user", "assistant", "developer", "x"])
        tools = rng.choice([None, [FN_WEATHER], [APPLY_PATCH, {"type": rng.choice(values)}]])
        extra = {"tool_choice": rng.choice(choices)} if tools else {}
        resp = await create(harness, input=[item], tools=tools, **extra)
        assert resp.status_code < 500, (item, resp.text)


async def test_the_openai_stream_helper_reads_keep_alives_and_every_event(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The openai SDK's own stream helper (it raises on an out-of-order event) over the
    in-process app, with keep-alives repeated while the engine is held."""
    from openai import AsyncOpenAI

    monkeypatch.setattr(pipeline, "KEEPALIVE_S", 0.05)
    harness.engine.gate = asyncio.Event()
    harness.engine.constrained = ["Sure: " + call("get_weather", PARIS)]
    client = AsyncOpenAI(base_url="http://loopstack.test/v1", api_key="x",
                         http_client=harness.client)  # fmt: skip

    async def release() -> None:
        await harness.engine.entered.wait()  # held from the engine on, however slow the box
        await asyncio.sleep(0.3)
        assert harness.engine.gate is not None
        harness.engine.gate.set()

    opener = asyncio.create_task(release())
    seen = []
    async with client.responses.stream(model=MODEL, input="hi", tools=[FN_WEATHER]) as stream:
        async for event in stream:
            seen.append(event.type)
        final = await stream.get_final_response()
    await opener
    assert seen.count("response.in_progress") >= 3, seen
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output_text == "Sure: "


# --------------------------------------------------------------------------- the context
async def test_a_prompt_too_long_streamed_is_response_failed_with_its_code(
    make_harness: Any,
) -> None:
    """Codex compacts its history only when a `response.failed` event says
    `context_length_exceeded`; it was a plain 400 before the stream, and Codex stopped."""
    h = make_harness(max_model_len=100)
    long = "word " * 200
    resp = await create(h, input=long, stream=True, tools=[FN_WEATHER])
    assert resp.status_code == 200, resp.text
    evs = events(resp.text)
    assert kinds(evs) == ["created", "in_progress", "failed"]
    error = evs[-1]["response"]["error"]
    assert error["code"] == "context_length_exceeded" and "context length" in error["message"]
    assert not h.engine.requests  # refused before the engine
    # whole: the HTTP error, in the OpenAI shape, with the same code
    resp = await create(h, input=long, tools=[FN_WEATHER])
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"


async def test_one_response_keeps_one_created_at(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each snapshot recomputed it: events a second apart said different times."""
    monkeypatch.setattr(pipeline, "KEEPALIVE_S", 0.3)
    harness.engine.constrained = [call("get_weather", PARIS)]
    harness.engine.gate = asyncio.Event()

    async def release() -> None:
        await harness.engine.entered.wait()  # held from the engine on, however slow the box
        await asyncio.sleep(1.3)  # keepalives cross at least one second boundary
        assert harness.engine.gate is not None
        harness.engine.gate.set()

    opener = asyncio.create_task(release())
    evs = events((await create(harness, stream=True, tools=[FN_WEATHER])).text)
    await opener
    assert kinds(evs).count("in_progress") >= 3
    stamps = {e["response"]["created_at"] for e in evs if "response" in e}
    assert len(stamps) == 1, stamps
