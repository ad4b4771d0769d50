"""One conversation, three APIs, one answer: the same conversation sent to chat completions,
Responses and Messages (temperature 0, each API's own shape, raw HTTP as a client sends it)
reaches the engine as the same prompt under the same constraint and selection defaults, so it
comes back as the same output - a call with the same arguments, or the same text. Before the
one pipeline, a tool round trip through Responses answered ``{`` and through Messages
``Karen(`` where chat answered in prose (the 1.5B, 2026-12-07)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SYSTEM = "You are a weather assistant. Use the tool when you need the weather."
QUESTION = "What is the weather in Paris right now?"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Current weather for a city"
ARGS = '{"city": "Paris"}'
RESULT = "Paris: 17 degrees C, foggy"
MAX = 48


def _chat(result: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    if result:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": ARGS}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
        ]
    fn = {"name": "get_weather", "description": DESCRIPTION, "parameters": PARAMS}
    tool = {"type": "function", "function": fn}
    return {"messages": messages, "tools": [tool], "temperature": 0, "max_tokens": MAX}


def _responses(result: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": QUESTION}]
    if result:
        items += [
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": ARGS},
            {"type": "function_call_output", "call_id": "call_1", "output": RESULT},
        ]  # fmt: skip
    tool = {"type": "function", "name": "get_weather", "description": DESCRIPTION,
            "parameters": PARAMS}  # fmt: skip
    return {"instructions": SYSTEM, "input": items, "tools": [tool], "temperature": 0,
            "max_output_tokens": MAX, "store": False}  # fmt: skip


def _messages(result: bool) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    if result:
        msgs += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": json.loads(ARGS)}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": RESULT}]},
        ]  # fmt: skip
    tool = {"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMS}
    return {"system": SYSTEM, "messages": msgs, "tools": [tool], "temperature": 0,
            "max_tokens": MAX}  # fmt: skip


def _answer(path: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """(text, [(tool name, arguments)]) of one API's whole answer."""
    if path.endswith("chat/completions"):
        msg = body["choices"][0]["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in msg.get("tool_calls") or []]  # fmt: skip
        return (msg.get("content") or "").strip(), calls
    if path.endswith("responses"):
        text = "".join(p["text"] for it in body["output"] if it["type"] == "message"
                       for p in it["content"])  # fmt: skip
        calls = [(it["name"], json.loads(it["arguments"]))
                 for it in body["output"] if it["type"] == "function_call"]  # fmt: skip
        return text.strip(), calls
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    calls = [(b["name"], b["input"]) for b in body["content"] if b["type"] == "tool_use"]
    return text.strip(), calls


@pytest.mark.parametrize("result", [False, True], ids=["first-turn", "after-a-tool-result"])
def test_one_conversation_answers_the_same_through_the_three_apis(
    server: Server, result: bool
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    answers, selection = {}, set()
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=600) as http:
        for path, make in [("/v1/chat/completions", _chat), ("/v1/responses", _responses),
                           ("/v1/messages", _messages)]:  # fmt: skip
            resp = http.post(path, json={"model": server.model, **make(result)})
            assert resp.status_code == 200, (path, resp.text)
            answers[path] = _answer(path, resp.json())
            selection.add(resp.headers.get("x-loopstack-selection"))
    assert len(selection) == 1, selection  # the same server defaults applied to each
    chat = answers["/v1/chat/completions"]
    assert chat[0] or chat[1], "chat answered nothing"
    assert answers["/v1/responses"] == chat, answers
    assert answers["/v1/messages"] == chat, answers
