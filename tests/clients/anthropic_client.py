"""The anthropic SDK against our server, as a user runs it: from its own venv (.venv-clients,
`make clients`), never the server's. Run with that venv's python:

    python tests/clients/anthropic_client.py MODEL [CASE ...]

The server comes from ANTHROPIC_BASE_URL (no /v1) and LOOPSTACK_TEST_KEY (sent once as
``x-api-key``, once as ``Authorization: Bearer``). Prints one JSON object: per case what the
SDK returned (content blocks, stop reason, usage, events seen) or the error it raised, for
tests/integration/test_messages_clients.py to judge (against a scripted engine) or to report
(against the real model). The tool is `get_weather(city)`; its result is a fixed string.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import anthropic

TIMEOUT_S = 300.0
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city's name"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
RESULT = "Sunny and 24 degrees in Paris (code 7731)."


def client(auth: str = "x-api-key") -> anthropic.Anthropic:
    key = os.environ.get("LOOPSTACK_TEST_KEY", "none")
    if auth == "bearer":
        return anthropic.Anthropic(auth_token=key, api_key=None, max_retries=0, timeout=TIMEOUT_S)
    return anthropic.Anthropic(api_key=key, max_retries=0, timeout=TIMEOUT_S)


def blocks(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def summary(message: Any) -> dict[str, Any]:
    return {
        "content": blocks(message),
        "stop_reason": message.stop_reason,
        "usage": message.usage.model_dump(exclude_none=True),
        "model": message.model,
    }


def create(model: str) -> dict[str, Any]:
    msg = client().messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "Say hello."}]
    )
    return summary(msg)


def bearer(model: str) -> dict[str, Any]:
    msg = client("bearer").messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "Say hello."}]
    )
    return summary(msg)


def stream(model: str) -> dict[str, Any]:
    events: list[str] = []
    with client().messages.stream(
        model=model,
        max_tokens=64,
        system=[{"type": "text", "text": "You are brief."}],
        messages=[{"role": "user", "content": "Say hello."}],
    ) as s:
        for ev in s:
            events.append(ev.type)
        final = s.get_final_message()
    return {**summary(final), "events": events}


def tools(model: str, choice: dict[str, Any], *, streamed: bool = False) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        model=model, max_tokens=200, tools=[WEATHER], tool_choice=choice, messages=ASK
    )
    if not streamed:
        return summary(client().messages.create(**kw))
    events: list[str] = []
    with client().messages.stream(**kw) as s:
        for ev in s:
            events.append(ev.type)
        final = s.get_final_message()
    return {**summary(final), "events": events}


def round_trip(model: str) -> dict[str, Any]:
    c = client()
    first = c.messages.create(
        model=model, max_tokens=200, tools=[WEATHER], tool_choice={"type": "any"}, messages=ASK
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    if not uses:
        return {"first": summary(first), "error": "no tool_use in the first answer"}
    use = uses[0]
    history = [
        *ASK,
        {"role": "assistant", "content": blocks(first)},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}],
        },
    ]
    second = c.messages.create(model=model, max_tokens=96, tools=[WEATHER], messages=history)
    return {"first": summary(first), "second": summary(second)}


def count_tokens(model: str) -> dict[str, Any]:
    c = client()
    short = c.messages.count_tokens(model=model, messages=ASK)
    longer = c.messages.count_tokens(model=model, messages=ASK, tools=[WEATHER])  # type: ignore[arg-type]
    return {"short": short.input_tokens, "with_tools": longer.input_tokens}


def unknown_model(_: str) -> dict[str, Any]:
    try:
        client().messages.create(
            model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    except anthropic.NotFoundError as exc:
        return {"status": exc.status_code, "type": exc.body["error"]["type"]}  # type: ignore[index]
    return {"status": 200}


CASES: dict[str, Callable[[str], dict[str, Any]]] = {
    "create": create,
    "bearer": bearer,
    "stream": stream,
    "tool-auto": lambda m: tools(m, {"type": "auto"}),
    "tool-any": lambda m: tools(m, {"type": "any"}),
    "tool-named": lambda m: tools(m, {"type": "tool", "name": "get_weather"}),
    "tool-none": lambda m: tools(m, {"type": "none"}),
    "tool-any-stream": lambda m: tools(m, {"type": "any"}, streamed=True),
    "round-trip": round_trip,
    "count-tokens": count_tokens,
    "unknown-model": unknown_model,
}


def main() -> None:
    model, wanted = sys.argv[1], sys.argv[2:] or list(CASES)
    out: dict[str, Any] = {"anthropic": version("anthropic"), "cases": {}}
    for name in wanted:
        try:
            out["cases"][name] = {"ok": True, **CASES[name](model)}
        except Exception as exc:  # reported, judged by the test
            out["cases"][name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "trace": traceback.format_exc()[-2000:],
            }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
