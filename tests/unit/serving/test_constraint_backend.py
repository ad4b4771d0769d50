"""The constraint backend owns the whole turn (loopstack.serving.constraint): the one schema walker,
the client constraints through the configured backend (no regex under guidance), the one retry
policy, the one engine-error mapping, the one sandbox, and a factory that alone knows the backend
classes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from loopstack.serving.config import DEFAULT_BACKEND
from loopstack.serving.constraint import regexes, schema_regex
from loopstack.serving.constraint.envelope import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.constraint.sandbox import CompilePool
from loopstack.serving.constraint.schema_limits import check_schema_limits, repair_schema
from loopstack.serving.constraint.turn import REGENERATE
from loopstack.serving.constraint.walker import (
    children,
    drop_patterns,
    exact_for_grammar,
    map_schema,
    refuse_unenforceable,
    walk,
)
from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.events import CallDelta
from loopstack.serving.protocol import ChatCompletionRequest
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import (
    WEATHER,
    assert_openai_error,
    call,
    chat_body,
    post_chat,
    sse_events,
)

SERVING = Path(__file__).resolve().parents[3] / "loopstack" / "serving"
KEYWORD_NAMES = ("format", "pattern", "contains", "not", "if")


def params_named(*names: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {n: {"type": "string"} for n in names},
        "required": list(names),
    }


# --------------------------------------------------------------------------- the walker
@pytest.mark.parametrize("name", KEYWORD_NAMES)
def test_a_parameter_named_like_a_keyword_is_a_parameter(name: str) -> None:
    schema = params_named(name, "city")
    assert exact_for_grammar(schema), name
    nodes = list(walk(schema))
    assert schema["properties"] not in nodes  # the map is never a schema node
    assert {"type": "string"} in nodes
    # the keyword itself, inside a parameter's schema, still counts
    uses = {"format": {"format": "date"}, "pattern": {"pattern": "^a+$"},
            "contains": {"contains": {"type": "string"}}, "not": {"not": {"const": "x"}},
            "if": {"if": {"const": "a"}, "then": {"minLength": 2}}}  # fmt: skip
    inner = {"type": "object", "properties": {name: {"type": "string", **uses[name]}}}
    assert not exact_for_grammar(inner), name


def test_the_walker_knows_where_subschemas_are() -> None:
    schema = {
        "type": "object",
        "properties": {"enum": {"type": "array", "items": {"type": "integer"}}},
        "anyOf": [{"required": ["enum"]}],
        "not": {"required": ["x"]},
        "enum": [{"pattern": "not a schema"}],
        "$defs": {"d": {"type": "number"}},
    }
    steps = [step for step, _ in children(schema)]
    assert steps == ["/properties/enum", "/$defs/d", "/not", "/anyOf/0"]
    assert "/not" not in [step for step, _ in children(schema, negated=False)]
    assert {"pattern": "not a schema"} not in list(walk(schema))
    copy = map_schema(schema, lambda node, out: {**out, "seen": True})
    assert copy["seen"] and copy["properties"]["enum"]["items"]["seen"]
    assert "seen" not in copy["properties"] and copy["enum"] == schema["enum"]
    assert copy["anyOf"][0]["seen"] and copy["$defs"]["d"]["seen"]


def test_every_walk_over_a_schema_is_the_one_walker() -> None:
    """Refusal, pattern dropping, limits and repairs read a parameter named like a keyword
    as a parameter."""
    tricky = {"type": "object", "properties": {
        "pattern": {"type": "string", "pattern": "^a+$"},
        "enum": {"type": "boolean", "enum": ["yes", "no"]},
        "not": {"type": "string"}}}  # fmt: skip
    dropped = drop_patterns(tricky)
    assert "pattern" in dropped["properties"] and "pattern" not in dropped["properties"]["pattern"]
    refuse_unenforceable(tricky, what="t")  # no lookaround anywhere: no refusal
    fixed, notes = repair_schema(tricky)
    assert notes == ["/properties/enum: type boolean -> string (its enum's values)"]
    check_schema_limits(fixed, what="t")
    with pytest.raises(InvalidRequest, match="lookaround"):
        refuse_unenforceable({"properties": {"format": {"pattern": "(?=a)"}}}, what="t")


async def test_a_tool_with_a_parameter_named_format_streams_its_call(harness: Harness) -> None:
    """It was marked inexact (the properties map read as a schema with `format`): held back
    until the whole turn was generated and validated. Now its argument deltas go out while
    the engine is still generating."""
    h = harness
    tool = {"type": "function", "function": {"name": "convert",
            "parameters": params_named("format", "pattern")}}  # fmt: skip
    args = {"format": "png", "pattern": "a*"}
    text = call("convert", args)
    h.engine.chunk = 1
    h.engine.constrained = [text]
    req = ChatCompletionRequest.model_validate(
        chat_body(tools=[tool], tool_choice="required", stream=True)
    )
    turn = await h.chat.turn(req)
    seen_at, arguments = [], ""
    async for ev in turn.events():
        if isinstance(ev, CallDelta):
            arguments += ev.arguments
            seen_at.append(h.engine.pieces_sent)
    assert json.loads(arguments) == args
    # held back, every delta would follow the engine's last chunk (len(text)); streamed, the
    # first follows the chunk that opened the arguments
    assert len(seen_at) > 10 and seen_at[0] == text.index("{", 1) + 1 < seen_at[-1]


async def test_a_turn_seen_before_builds_no_grammar(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict is cached by the turn's key: the grammar text (and its pattern-free twin)
    is built on the first turn of a tool set only, not on every request."""
    h = harness
    built: list[Any] = []
    real = type(h.backend).build

    def counting(self: Any, spec: Any) -> Any:
        built.append(spec)
        return real(self, spec)

    monkeypatch.setattr(type(h.backend), "build", counting)
    for _ in range(3):
        h.engine.constrained = [call("get_weather", {"city": "Paris", "days": 2})]
        resp = await post_chat(h, tools=[WEATHER], tool_choice="required")
        assert resp.status_code == 200, resp.text
    assert len(built) == 1 and len(h.engine.requests) == 3


# --------------------------------------------------------------------------- client constraints
@pytest.fixture
def no_regex(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any use of the regex pipeline fails the test."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the regex path was called")

    monkeypatch.setattr(schema_regex, "compile_schema", forbidden)
    monkeypatch.setattr(regexes, "compile_schema", forbidden)
    monkeypatch.setattr(regexes, "count_states", forbidden)
    monkeypatch.setattr(regexes.RegexSchemas, "get", forbidden)
    monkeypatch.setattr(regexes.RegexSchemas, "check_regex", forbidden)
    monkeypatch.setattr(regexes.AutomatonProbe, "check", forbidden)


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["answer"],
}
RF = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}


async def test_response_format_under_guidance_is_a_grammar_not_a_regex(
    harness: Harness, no_regex: None
) -> None:
    h = harness
    assert h.backend.name == "guidance"
    resp = await post_chat(h, response_format=RF)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == {"answer": 42}
    [(path, body)] = h.engine.requests
    assert path == "/v1/chat/completions" and "response_format" not in body
    [grammar] = body["structured_outputs"].values()
    assert set(body["structured_outputs"]) == {"grammar"} and grammar.startswith("%llguidance")
    assert '"maximum": 100' in grammar and "x-guidance" in grammar
    # the completions route and the other spellings take the same path
    for extra in ({"guided_json": ANSWER}, {"structured_outputs": {"json": ANSWER}}):
        h.engine.requests.clear()
        h.engine.constrained = ['{"answer": 1}']
        resp = await h.client.post("/v1/completions", json={"model": MODEL, "prompt": "x", **extra})
        assert resp.status_code == 200, resp.text
        [(_, sent)] = h.engine.requests
        assert sent["structured_outputs"] == {"grammar": grammar}
    # the agent's own answer and plan calls: whatever the schema, no regex is made
    unsat = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "enum": []}}}
    assert assert_openai_error(await post_chat(h, response_format=unsat), 400)["code"] == (
        "invalid_schema"
    )


async def test_a_client_regex_under_guidance_is_compiled_by_llguidance(
    harness: Harness, no_regex: None
) -> None:
    h = harness
    resp = await h.client.post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "guided_regex": "(?=a)b"})  # fmt: skip
    err = assert_openai_error(resp, 400)
    assert err["code"] == "invalid_schema" and "guidance" in err["message"]
    assert h.engine.requests == []


@pytest.mark.parametrize("backend", ["guidance", "outlines"])
async def test_response_format_output_that_fails_its_schema_is_generated_again(
    make_harness: Any, backend: str
) -> None:
    h: Harness = make_harness(backend=backend)
    h.engine.chat_script = ['{"answer": 420}', '{"answer": 7}']
    resp = await post_chat(h, response_format=RF, temperature=0.1)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == {"answer": 7}
    sent = [b for _, b in h.engine.requests]
    assert [b.get("seed") for b in sent] == [None, 1]
    assert sent[0]["temperature"] == 0.1 and sent[1]["temperature"] == 0.7
    h.engine.requests.clear()
    h.engine.chat_script = ['{"answer": 420}']
    resp = await post_chat(h, response_format=RF)
    assert_openai_error(resp, 502, type_="tool_call_validation_error")
    assert [b.get("seed") for _, b in h.engine.requests] == [None, 1, 2]


def test_one_retry_policy() -> None:
    assert REGENERATE.attempts == 3
    assert REGENERATE.sampling(0, 0.2) == {}
    assert REGENERATE.sampling(1, 0.2) == {"temperature": 0.7, "seed": 1}
    assert REGENERATE.sampling(2, 0.9) == {"temperature": 0.9, "seed": 2}


# --------------------------------------------------------------------------- engine errors
@pytest.mark.parametrize("backend", ["guidance", "outlines"])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_failure_under_a_constraint_is_a_502(
    make_harness: Any, backend: str, stream: bool
) -> None:
    h: Harness = make_harness(backend=backend)
    h.engine.fail = (500, {"error": {"message": "grammar compile timed out"}})
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required", stream=stream)
    if stream:
        [error] = [e["error"] for e in sse_events(resp.text) if "error" in e]
    else:
        error = assert_openai_error(resp, 502)
    assert error["type"] == "tool_call_validation_error"
    assert "failed while generating under" in error["message"]
    assert "grammar compile timed out" in error["message"]
    h.engine.fail = (400, {"error": {"message": "bad request", "param": "x"}})
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required")
    assert assert_openai_error(resp, 400)["message"] == "bad request"  # a 4xx passes on


async def test_the_baseline_is_not_a_constraint_failure(harness: Harness) -> None:
    harness.engine.fail = (500, {"error": {"message": "boom"}})
    resp = await post_chat(
        harness, tools=[WEATHER], tool_choice="required", loopstack={"constrained": False}
    )
    assert assert_openai_error(resp, 502)["type"] == "engine_error"


# --------------------------------------------------------------------------- the seam
def test_the_unit_harness_runs_the_default_backend() -> None:
    assert DEFAULT_BACKEND == "guidance"
    assert Harness().chat.backend.name == "guidance"


def test_the_factory_builds_each_backend_complete_with_one_sandbox_design() -> None:
    for name in ("guidance", "xgrammar", "outlines"):
        backend: Any = make_backend(name, None, mode="process")  # type: ignore[arg-type]
        assert backend.name == name
        if name == "outlines":  # one pool for the regex compile and the automaton probe
            assert backend.regexes.compiler.pool is backend.regexes.probe.pool
            pool = backend.regexes.compiler.pool
        else:
            pool = backend.pool
        assert isinstance(pool, CompilePool) and pool.mode == "process"
        backend.close()


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SERVING)): p.read_text() for p in SERVING.rglob("*.py")}


def test_only_the_factory_knows_the_backend_classes() -> None:
    isinstance_of_backend = re.compile(r"isinstance\([^)]*Backend\b")
    found = [f for f, text in _sources().items() if isinstance_of_backend.search(text)]
    assert found == [], found
    built = re.compile(r"(?<!class )\b(GuidanceBackend|XGrammarBackend|OutlinesBackend)\(")
    named = [f for f, text in _sources().items()
             if f != "constraint/factory.py" and built.search(text)]  # fmt: skip
    assert named == [], named


def test_one_sandbox_starts_worker_processes() -> None:
    spawning = [f for f, text in _sources().items()
                if "ProcessPoolExecutor(" in text or "create_subprocess_exec" in text]  # fmt: skip
    assert spawning == ["constraint/sandbox.py"], spawning


async def test_a_chat_body_with_keyword_named_parameters_is_served(harness: Harness) -> None:
    """End to end under the default backend: the tool is exact, called in one request."""
    tool = {"type": "function", "function": {"name": "q", "parameters": params_named(
        *KEYWORD_NAMES)}}  # fmt: skip
    args = {n: "v" for n in KEYWORD_NAMES}
    harness.engine.constrained = [call("q", args)]
    resp = await harness.client.post(
        "/v1/chat/completions", json=chat_body(tools=[tool], tool_choice="required")
    )
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == args
    assert len(harness.engine.requests) == 1


# --------------------------------------------------------------------------- an answer beside tools
async def test_response_format_beside_tools_holds_the_answer_of_an_auto_turn(
    harness: Harness,
) -> None:
    """The Agents SDK's ``output_type`` with a function tool sends both: it was refused (400
    "response_format cannot be combined with tools"). Now the turn's grammar is the answer
    under the schema or a call, one engine request; the answer comes back as the content."""
    h = harness
    h.engine.constrained = ['{"answer": 42}']
    resp = await post_chat(h, tools=[WEATHER], response_format=RF)
    assert resp.status_code == 200, resp.text
    msg = resp.json()["choices"][0]["message"]
    assert json.loads(msg["content"]) == {"answer": 42} and not msg.get("tool_calls")
    [(path, body)] = h.engine.requests
    assert path == "/v1/completions" and "response_format" not in body
    grammar = body["structured_outputs"]["grammar"]
    assert "answer: %json" in grammar and '"maximum": 100' in grammar
    assert 'follows this JSON schema: {"type":"object"' in body["prompt"]  # the model is told
    assert "Call the tools the request needs first" in body["prompt"]
    # a call is still a call
    h.engine.requests.clear()
    h.engine.constrained = [TOOL_CALL_OPEN + call("get_weather", {"city": "Paris", "days": 2})]
    resp = await post_chat(h, tools=[WEATHER], response_format=RF)
    assert resp.status_code == 200, resp.text
    [got] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert got["function"]["name"] == "get_weather"
    # a turn that must call ignores the answer's schema (as OpenAI does); an unsatisfiable
    # answer schema is refused in the API's shape before anything is generated
    h.engine.constrained = [call("get_weather", {"city": "Paris", "days": 2})]
    resp = await post_chat(h, tools=[WEATHER], response_format=RF, tool_choice="required")
    assert resp.status_code == 200, resp.text
    h.engine.requests.clear()
    unsat = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "enum": []}}}
    err = assert_openai_error(await post_chat(h, tools=[WEATHER], response_format=unsat), 400)
    assert err["param"] == "response_format.json_schema" and h.engine.requests == []


async def test_response_format_beside_tools_on_a_backend_that_cannot_hold_it(
    make_harness: Any,
) -> None:
    h: Harness = make_harness(backend="xgrammar")
    err = assert_openai_error(await post_chat(h, tools=[WEATHER], response_format=RF), 400)
    assert err["code"] == "unsupported_constraint" and "guidance" in err["message"]
    assert h.engine.requests == []


def test_the_answer_grammar_allows_the_answer_or_calls_and_nothing_else() -> None:
    llg = pytest.importorskip("llguidance")
    from loopstack.serving.constraint.backend import TurnSpec
    from loopstack.serving.constraint.guidance import _ByteTokenizer, lark_grammar

    tok = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))
    params = {"get_weather": WEATHER["function"]["parameters"]}

    def accepts(spec: TurnSpec, text: str) -> bool:
        m = llg.LLMatcher(tok, llg.grammar_from("grammar", lark_grammar(spec)))
        return bool(m.consume_tokens(list(text.encode()))) and m.is_accepting()

    for decide in (False, True):
        spec = TurnSpec("auto", params, parallel=True, decide=decide, answer=ANSWER)
        head = ("Decision: none\n", "Decision: get_weather\n") if decide else ("", "")
        weather = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
        assert accepts(spec, head[0] + '{"answer": 42}'), decide
        assert accepts(spec, head[1] + TOOL_CALL_OPEN + weather + TOOL_CALL_CLOSE), decide
        if not decide:  # a bare call, as small models write one (in the answer's branch)
            assert accepts(spec, weather) and not accepts(spec, weather + "\n" + weather)
            assert not accepts(spec, weather.replace("get_weather", "get_time"))
        assert not accepts(spec, head[0] + "The answer is 42."), decide
        assert not accepts(spec, head[0] + '{"answer": 420}'), decide  # out of its bounds
        assert not accepts(spec, head[0] + '{"answer": 42} and more'), decide
        assert not accepts(spec, head[0] + '{"answer": "42"}'), decide
        assert not accepts(spec, head[1] + TOOL_CALL_OPEN + weather + "\nHope this helps"), decide
