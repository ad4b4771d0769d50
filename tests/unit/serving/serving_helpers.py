"""Tools, requests and SSE helpers shared by the router tests."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.serving.serving_fakes import MODEL, Harness

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
