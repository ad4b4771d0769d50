"""One engine request per model turn that may call tools, read from vLLM's own counter
(``vllm:request_success_total``, relayed on our /metrics), and text answers in ``auto`` that
look like calls but name no offered tool staying text (issue 20's two prompts)."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI

from tests.integration.conftest import Server, send_at_once
from tests.integration.test_tools import SCHEMAS, TOOLS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search the project's files",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
AGENT_TOOLS = [*TOOLS, SEARCH]
SYSTEM = "You are a helpful assistant. Use the tools when they help."
_COUNTER = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.eE+]+)$", re.M)


def engine_requests(server: Server) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return sum(float(v) for v in _COUNTER.findall(text))


def settled_count(server: Server, before: float) -> float:
    """The counter once it stops moving (vLLM counts a request as it finishes)."""
    last, deadline = engine_requests(server), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = engine_requests(server)
        if now == last:
            break
        last = now
    return last - before


@pytest.mark.parametrize(
    "choice",
    ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["auto", "required", "named"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_engine_request_per_turn(
    client: OpenAI, server: Server, choice: Any, stream: bool
) -> None:
    if stream and choice != "auto":
        pytest.skip("streamed: auto only (the mode the agent runtime uses), to save model time")
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Paris for the next 6 days?"},
    ]
    before = engine_requests(server)
    resp = client.chat.completions.create(
        model=server.model, messages=messages, tools=AGENT_TOOLS, tool_choice=choice,
        max_tokens=120, temperature=0, stream=stream,
    )  # fmt: skip
    calls: list[tuple[str, str]] = []
    if stream:
        parts: dict[int, list[str]] = {}
        for chunk in resp:  # type: ignore[union-attr]
            for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                slot = parts.setdefault(tc.index, ["", ""])
                slot[0] = (tc.function and tc.function.name) or slot[0]
                slot[1] += (tc.function and tc.function.arguments) or ""
        calls = [(n, a) for n, a in parts.values()]
    else:
        msg = resp.choices[0].message  # type: ignore[union-attr]
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    assert settled_count(server, before) == 1
    if choice != "auto":
        assert calls, "required/named must call"
    for name, args in calls:
        schemas = {**SCHEMAS, "search_files": SEARCH["function"]["parameters"]}
        jsonschema.validate(json.loads(args), schemas[name])


TEXT_ONLY = [
    "Write a JSON example of a user profile with the keys name and age, in a ```json code "
    "block. Do not call any tool.",
    'Give me a JSON object {"name": "Ann", "arguments": 3} exactly as written, in a code block.',
]


@pytest.fixture(scope="module")
def text_replies(client: OpenAI, server: Server) -> dict[str, Future[Any]]:
    """Both prompts at once (the engine batches them)."""
    weather = {**TOOLS[0]["function"]}
    tools: list[Any] = [{"type": "function", "function": weather}, SEARCH]
    return send_at_once(
        client,
        {
            prompt: {
                "model": server.model, "messages": [{"role": "user", "content": prompt}],
                "tools": tools, "tool_choice": "auto", "max_tokens": 80, "temperature": 0,
            }
            for prompt in TEXT_ONLY
        },
    )  # fmt: skip


@pytest.mark.parametrize("prompt", TEXT_ONLY, ids=["json-code-block", "look-alike-object"])
def test_text_answers_in_auto_are_not_calls(
    text_replies: dict[str, Future[Any]], prompt: str
) -> None:
    msg = text_replies[prompt].result().choices[0].message
    assert not msg.tool_calls, msg.tool_calls
    assert msg.content and "{" in msg.content
