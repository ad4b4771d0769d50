"""Tool selection on the server (loopstack.serving.selection.requests): ranked tools
(`loopstack.tool_rank`), no identical repeat (`loopstack.no_repeat`) and the repair of
self-contradicting schemas."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from loopstack.memory.embedding import HashingEmbedder
from loopstack.serving.constraint.backend import TurnSpec
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.constraint.guidance import lark_grammar
from loopstack.serving.constraint.no_repeat import excluding, executed_calls
from loopstack.serving.constraint.schema_limits import repair_schema
from loopstack.serving.selection.rank import ToolRanker
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import ADD, WEATHER, call, post_chat

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "alerts": {"type": "boolean"},
        "lat": {"type": "number"},
    },
    "required": ["city"],
}


def valid(schema: Any, value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


# --- excluding: the schema minus the calls already answered -------------------------------


@pytest.mark.parametrize(
    "done",
    [
        {"city": "Paris"},
        {"city": "Paris", "days": 3},
        {"city": "Paris", "days": 3, "units": "metric", "alerts": True, "lat": 48.85},
        {"city": "", "days": 1},
    ],
)
def test_the_answered_call_is_refused_and_others_are_admitted(done: dict[str, Any]) -> None:
    left = excluding(CITY, [done])
    assert left is not None and not valid(left, done)
    others = [
        {**done, "city": "Lyon"},
        {**done, "city": "Pari"},
        {**done, "days": 4},
        {**done, "units": "imperial"},
        {**done, "alerts": not done.get("alerts", False)},
        {**done, "lat": 1.5},
    ]
    for other in others:
        if other != done:
            assert valid(CITY, other) and valid(left, other), other
    # a string that only extends the answered one is refused too (the 0.5B wrote "Paris}}")
    if done["city"]:
        assert not valid(left, {**done, "city": done["city"] + "}}"})
    # nothing outside the client's schema is let in
    assert not valid(left, {**done, "days": 9}) and not valid(left, {"days": 2})


def test_several_answered_calls_are_all_refused() -> None:
    done = [{"city": "Paris"}, {"city": "Lyon"}, {"city": "Paris", "days": 2}]
    left = excluding(CITY, done)
    assert all(not valid(left, d) for d in done)
    assert valid(left, {"city": "Nice"}) and valid(left, {"city": "Lyon", "days": 2})


def test_what_cannot_be_excluded_is_left_as_it_is() -> None:
    assert excluding({"type": "object", "properties": {}}, [{}]) is None  # no parameters
    one = {"type": "object", "properties": {"u": {"enum": ["a"]}}, "required": ["u"]}
    assert excluding(one, [{"u": "a"}]) is None  # the only value was used
    pattern = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}
    assert excluding(pattern, [{"id": "abc"}]) == pattern  # a second pattern: not said
    composed = {"anyOf": [CITY]}
    assert excluding(composed, [{"city": "x"}]) is composed
    assert excluding(CITY, []) is CITY


def test_executed_calls_are_those_with_a_tool_reply() -> None:
    args = json.dumps({"city": "Paris"})
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "w", "arguments": args}},
                {"id": "b", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                {"id": "c", "type": "function", "function": {"name": "w", "arguments": "{x"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "{}"},
        {"role": "tool", "tool_call_id": "c", "content": "{}"},
    ]
    assert executed_calls(messages) == {"w": [{"city": "Paris"}]}


def test_the_guidance_grammar_refuses_the_repeat_and_takes_another_call() -> None:
    llg = pytest.importorskip("llguidance")
    from loopstack.serving.constraint.guidance import _ByteTokenizer

    tok = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))
    spec = TurnSpec("required", {"w": excluding(CITY, [{"city": "Paris", "days": 3}])}, False)
    grammar = llg.grammar_from("grammar", lark_grammar(spec))

    def accepts(args: str) -> bool:
        m = llg.LLMatcher(tok, grammar)
        text = '{"name": "w", "arguments": ' + args + "}"
        return bool(m.consume_tokens(list(text.encode()))) and m.is_accepting()

    assert not accepts('{"city": "Paris", "days": 3}')
    assert not accepts('{"city": "Paris}}", "days": 3}')
    assert not accepts('{"city": " paris", "days": 3}')  # read past blanks, without case
    assert accepts('{"city": "Paris", "days": 4}')
    assert accepts('{"city": "Lyon", "days": 3}')
    assert accepts('{"city": "Paris", "days": 3, "units": "metric"}')


# --- through the service ----------------------------------------------------------------------


def _history(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 18}'},
    ]


@pytest.fixture
def guidance(make_harness: Callable[..., Harness]) -> Harness:
    backend = make_backend("guidance", None, mode="thread")
    return make_harness(backend=backend, ranker=ToolRanker(HashingEmbedder()))


async def test_no_repeat_puts_the_exclusion_in_the_turn_grammar(guidance: Harness) -> None:
    h = guidance
    h.engine.constrained = ["The weather in Paris is 18 degrees."]
    messages = _history("get_weather", {"city": "Paris", "days": 5})
    resp = await post_chat(
        h, messages=messages, tools=[WEATHER, ADD], loopstack={"no_repeat": True}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"].startswith("The weather")
    [(_, sent)] = h.engine.requests
    grammar = sent["structured_outputs"]["grammar"]
    assert '"anyOf"' in grammar and "^\\\\s*(?:" in grammar  # the call, minus the repeat
    # without the option the same request is constrained as before
    h.engine.requests.clear()
    resp = await post_chat(h, messages=messages, tools=[WEATHER, ADD])
    assert resp.status_code == 200 and '"anyOf"' not in json.dumps(h.engine.requests)


async def test_when_every_call_was_made_the_reply_is_text(guidance: Harness) -> None:
    h = guidance
    ping = {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}}}}  # fmt: skip
    h.engine.chat_content = "pong was answered"
    resp = await post_chat(
        h, messages=_history("ping", {}), tools=[ping], loopstack={"no_repeat": True}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "pong was answered"
    [(path, sent)] = h.engine.requests
    assert path == "/v1/chat/completions" and "tools" not in sent
    # where a call is demanded, that is a clear 400, not a call the client did not want
    resp = await post_chat(
        h,
        messages=_history("ping", {}),
        tools=[ping],
        tool_choice="required",
        loopstack={"no_repeat": True},
    )
    assert resp.status_code == 400 and "already made" in resp.json()["error"]["message"]


def _tool(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}  # fmt: skip


async def test_tool_rank_offers_the_best_first_and_cuts_to_top_k(guidance: Harness) -> None:
    h = guidance
    tools = [
        _tool("sales_total", "Total sales for a month"),
        _tool("read_file", "Read a file from the workspace"),
        _tool("get_weather", "Current weather for a city"),
    ]
    h.engine.constrained = [call("get_weather", {"q": "Paris"})]
    user = [{"role": "user", "content": "What is the weather for the city of Paris?"}]
    resp = await post_chat(
        h, messages=user, tools=tools, tool_choice="required", loopstack={"tool_rank": {"top_k": 2}}
    )
    assert resp.status_code == 200, resp.text
    offered = resp.headers["x-loopstack-tools-offered"].split(",")
    assert offered[0] == "get_weather" and len(offered) == 2
    [(_, sent)] = h.engine.requests
    assert sent["prompt"].index("get_weather") < sent["prompt"].index(offered[1])
    assert "sales_total" not in sent["prompt"] or offered[1] == "sales_total"
    # tools named in `always` follow the ranked ones, outside top_k (an agent's own tools)
    h.engine.requests.clear()
    rank = {"top_k": 1, "always": ["sales_total"]}
    resp = await post_chat(
        h, messages=user, tools=tools, tool_choice="required", loopstack={"tool_rank": rank}
    )
    assert resp.headers["x-loopstack-tools-offered"] == "get_weather,sales_total"
    # a min_score nothing reaches: answered in text, with no tools at all
    h.engine.requests.clear()
    h.engine.chat_content = "no tool needed"
    resp = await post_chat(
        h, messages=user, tools=tools, loopstack={"tool_rank": {"min_score": 1.9}}
    )
    assert resp.status_code == 200 and resp.headers["x-loopstack-tools-offered"] == ""
    assert resp.json()["choices"][0]["message"]["content"] == "no tool needed"
    # the floor was set on English requests: a Chinese one keeps its tools, cut by top_k only
    h.engine.requests.clear()
    zh = [{"role": "user", "content": "巴黎今天天气怎么样？"}]
    rank = {"min_score": 1.9, "top_k": 2}
    resp = await post_chat(h, messages=zh, tools=tools, loopstack={"tool_rank": rank})
    assert resp.status_code == 200, resp.text
    offered = resp.headers["x-loopstack-tools-offered"].split(",")
    assert len(offered) == 2, offered
    prompt = h.engine.requests[0][1]["prompt"]
    assert all(name in prompt for name in offered)
    # an ordinary request is unchanged: no header, the tools as given
    h.engine.requests.clear()
    h.engine.constrained = [call("sales_total", {"q": "x"})]
    resp = await post_chat(h, messages=user, tools=tools, tool_choice="required")
    assert "x-loopstack-tools-offered" not in resp.headers
    prompt = h.engine.requests[0][1]["prompt"]
    assert prompt.index("sales_total") < prompt.index("read_file") < prompt.index("get_weather")


async def test_tool_rank_without_an_embedder_is_a_clear_400(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    resp = await post_chat(h, tools=[WEATHER], loopstack={"tool_rank": {"top_k": 1}})
    assert resp.status_code == 400 and "embedding" in resp.json()["error"]["message"]


# --- one odd tool must not sink the request --------------------------------------------------


def test_an_enum_wins_over_a_type_none_of_its_values_fit() -> None:
    odd = {
        "type": "object",
        "properties": {
            "flag": {"type": "boolean", "enum": ["True", "False", "dontcare"]},
            "n": {"type": "integer", "enum": ["1", 2.5]},
            "ok": {"type": "string", "enum": ["a", 1]},  # one value fits: as written
            "c": {"type": "integer", "const": "x"},
        },
    }
    fixed, notes = repair_schema(odd)
    props = fixed["properties"]
    assert props["flag"]["type"] == "string" and props["n"]["type"] == ["number", "string"]
    assert props["ok"] == odd["properties"]["ok"] and props["c"]["type"] == "string"
    assert len(notes) == 3 and all("/properties/" in n for n in notes)
    assert odd["properties"]["flag"]["type"] == "boolean"  # the client's schema is not touched
    assert repair_schema(CITY) == (CITY, [])


async def test_a_repaired_tool_is_served_and_says_so(guidance: Harness) -> None:
    h = guidance
    odd = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"veg": {"type": "boolean",
        "enum": ["True", "False", "dontcare"]}}, "required": ["veg"]}}}  # fmt: skip
    h.engine.constrained = [call("book", {"veg": "dontcare"})]
    resp = await post_chat(h, tools=[WEATHER, odd], tool_choice="required")
    assert resp.status_code == 200, resp.text
    assert (
        "book: /properties/veg: type boolean -> string"
        in resp.headers["x-loopstack-schema-repaired"]
    )
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"veg": "dontcare"}
    grammar = h.engine.requests[0][1]["structured_outputs"]["grammar"]
    assert '"dontcare"' in grammar
    # no reading at all (an empty enum) is still refused
    empty = {"type": "function", "function": {"name": "e", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "enum": []}}}}}  # fmt: skip
    resp = await post_chat(h, tools=[WEATHER, empty])
    assert resp.status_code == 400


async def test_abstain_puts_the_rule_in_the_system_message(guidance: Harness) -> None:
    from loopstack.serving.selection.requests import ABSTAIN_RULE

    h = guidance
    h.engine.constrained = ["A book: {}"]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for messages, head in (([{"role": "user", "content": "Hi"}], "system\n" + ABSTAIN_RULE),
                           (system, "system\nBe brief.\n\n" + ABSTAIN_RULE)):  # fmt: skip
        h.engine.requests.clear()
        resp = await post_chat(h, messages=messages, tools=[WEATHER], loopstack={"abstain": True})
        assert resp.status_code == 200, resp.text
        assert head in h.engine.requests[0][1]["prompt"]
    h.engine.requests.clear()
    await post_chat(h, messages=system, tools=[WEATHER])
    assert ABSTAIN_RULE not in h.engine.requests[0][1]["prompt"]
