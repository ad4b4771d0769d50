"""Generation obeys the grammar: the real chat service and guidance backend in front of an
engine that samples token by token under the grammar it is sent (`grammar_engine`), in the
``auto``, ``required`` and named modes. The "model" wants to write what the schemas forbid
(an unknown tool, wrong types, a missing required key); what comes back must be valid calls
of the offered tools all the same - and, without the grammar (the negative control), the
same "model" gets nothing valid past the server."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from tests.unit.serving.grammar_engine import SamplingEngine
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import ADD, WEATHER, chat_body

TOOLS: list[dict[str, Any]] = json.loads(json.dumps([ADD, WEATHER]))
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# an unknown tool, and the arguments of neither tool
WRONG_NAME = '{"name": "get_wether", "arguments": {"city": 5, "days": "soon"}}'
# a known tool, wrong types, a required key missing
WRONG_TYPES = '{"name": "add", "arguments": {"a": "one"}}'
SEEDS = range(4)


def sampling(make_harness: Callable[..., Harness], seed: int, **kw: Any) -> SamplingEngine:
    h = make_harness(backend="guidance")
    engine = SamplingEngine(seed=seed, **kw)
    h.state.engine = h.chat.engine = engine  # type: ignore[assignment]
    engine.harness = h  # type: ignore[attr-defined]
    return engine


async def ask(engine: SamplingEngine, **kw: Any) -> Any:
    h: Harness = engine.harness  # type: ignore[attr-defined]
    return await h.client.post("/v1/chat/completions", json=chat_body(tools=[ADD, WEATHER], **kw))


def valid_calls(message: dict[str, Any], offered: set[str]) -> list[str]:
    """The calls' names, each checked: an offered tool, arguments valid for its schema."""
    names = []
    for c in message.get("tool_calls") or []:
        name = c["function"]["name"]
        assert name in offered, c
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
        names.append(name)
    return names


@pytest.mark.parametrize("want", [WRONG_NAME, WRONG_TYPES], ids=["wrong-name", "wrong-types"])
@pytest.mark.parametrize("seed", SEEDS)
async def test_required_turns_are_valid_calls(
    make_harness: Callable[..., Harness], want: str, seed: int
) -> None:
    engine = sampling(make_harness, seed)
    engine.want = want
    r = await ask(engine, tool_choice="required", max_tokens=200)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert valid_calls(choice["message"], set(SCHEMAS))  # at least one call, each valid
    assert choice["finish_reason"] == "tool_calls"
    assert "grammar" in engine.requests[0]["structured_outputs"]
    assert len(engine.requests) == 1  # exact schemas: valid the first time, no regeneration


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_named_turn_calls_the_named_tool(
    make_harness: Callable[..., Harness], seed: int
) -> None:
    engine = sampling(make_harness, seed)
    engine.want = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    named = {"type": "function", "function": {"name": "add"}}
    r = await ask(engine, tool_choice=named, max_tokens=200)
    assert r.status_code == 200, r.text
    assert valid_calls(r.json()["choices"][0]["message"], {"add"}) == ["add"]


@pytest.mark.parametrize("seed", SEEDS)
async def test_auto_turns_are_text_or_valid_calls(
    make_harness: Callable[..., Harness], seed: int
) -> None:
    engine = sampling(make_harness, seed)
    engine.want = "Let me check.\n<tool_call>\n" + WRONG_NAME + "\n</tool_call>"
    r = await ask(engine, tool_choice="auto", max_tokens=200)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert valid_calls(message, set(SCHEMAS))  # the call began: it became a valid one
    assert message["content"] == "Let me check."
    engine.want = "It is sunny in Paris."  # no call: the text as written
    r = await ask(engine, tool_choice="auto", max_tokens=200)
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "It is sunny in Paris." and not message.get("tool_calls")


async def test_without_the_grammar_the_same_model_gets_nothing_valid_out(
    make_harness: Callable[..., Harness],
) -> None:
    """The negative control: the sampler ignores the grammar, the server's own validation
    refuses every attempt (502), none of the invalid calls reaches the client."""
    engine = sampling(make_harness, 0, grammar_free=True)
    engine.want = WRONG_TYPES
    r = await ask(engine, tool_choice="required", max_tokens=200)
    assert r.status_code == 502, r.text
    assert engine.texts == [WRONG_TYPES] * 3  # generated, refused, generated again twice
