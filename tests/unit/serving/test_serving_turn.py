"""One engine request per turn: the turn parser, the grammar backends' constraints (compiled
with the real xgrammar / llguidance over a byte vocabulary) and ChatService on that path."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from loopstack.serving.constraint.backend import ConstraintBackend, TurnSpec
from loopstack.serving.constraint.calltext import CallReader, ContentDelta
from loopstack.serving.constraint.envelope import (
    CALL_SEPARATOR,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    stem_groups,
)
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.constraint.guidance import lark_grammar
from loopstack.serving.constraint.walker import exact_for_grammar
from loopstack.serving.constraint.xgrammar import structural_tag
from tests.unit.serving.serving_fakes import Harness
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

PARAMS = {n["function"]["name"]: n["function"]["parameters"] for n in (WEATHER, ADD)}
FENCED = (
    'Sure, let me look.\n```json\n{\n  "name": "get_weather",\n  "arguments": {\n'
    '    "city": "Paris",\n    "days": 5\n  }\n}\n```'
)
PARIS_LINE = '{"city": "Paris", "days": 5}'
CODE_BLOCK = 'Here:\n```json\n{\n  "name": "Ann",\n  "arguments": 3\n}\n```\nDone.'


def parse(text: str, *, chunk: int = 0, max_calls: int = 16) -> tuple[str, list[Any]]:
    p = CallReader.tools(list(PARAMS), max_calls=max_calls)
    events = []
    for piece in [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]:
        events += p.feed(piece)
    events += p.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return content, [(c.name, json.loads(c.arguments), c.complete) for c in p.calls]


@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_parser_reads_a_fenced_pretty_printed_call(chunk: int) -> None:
    content, calls = parse(FENCED, chunk=chunk)
    assert content == "Sure, let me look.\n"
    assert calls == [("get_weather", {"city": "Paris", "days": 5}, True)]


@pytest.mark.parametrize("chunk", [0, 1, 4])
def test_parser_leaves_code_blocks_and_look_alikes_as_text(chunk: int) -> None:
    content, calls = parse(CODE_BLOCK, chunk=chunk)
    assert calls == [] and content == CODE_BLOCK
    text = 'Use {"name": "get_weather_v2", "arguments": {}} or "name" in prose.'
    assert parse(text, chunk=chunk) == (text, [])


def test_parser_reads_parallel_tagged_calls_and_honours_max_calls() -> None:
    text = call("get_weather", PARIS) + CALL_SEPARATOR + call("add", {"a": 1, "b": 2})
    _, calls = parse(text, chunk=2)
    assert [c[0] for c in calls] == ["get_weather", "add"]
    _, one = parse(text, max_calls=1)
    assert [c[0] for c in one] == ["get_weather"]


def test_parser_marks_a_cut_off_call_incomplete() -> None:
    p = CallReader.tools(["add"], max_calls=4)
    p.feed('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b"')
    assert len(p.calls) == 1 and not p.calls[0].complete


# --------------------------------------------------------------------------- the constraints
@pytest.fixture(scope="module")
def xgr_check() -> Callable[[dict[str, Any], str], bool]:
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo([chr(i) for i in range(256)])
    compiler = xgr.GrammarCompiler(info, max_threads=1)

    def accepts(tag: dict[str, Any], text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
        return bool(matcher.accept_string(text))

    return accepts


def test_xgrammar_auto_enforces_a_call_only_where_a_tool_is_named(xgr_check: Any) -> None:
    tag = structural_tag(TurnSpec("auto", PARAMS, parallel=True))
    assert xgr_check(tag, FENCED)
    assert not xgr_check(tag, FENCED.replace('"days": 5', '"days": 9'))  # maximum 7
    assert xgr_check(tag, CODE_BLOCK)  # not a tool: free text
    assert xgr_check(tag, "Just text, no call.")
    tagged = TOOL_CALL_OPEN + call("add", {"a": 1, "b": 2})
    assert xgr_check(tag, tagged + "\n")
    assert not xgr_check(tag, tagged + "\nMore text")  # after a call: its tail, the end
    assert not xgr_check(tag, tagged + CALL_SEPARATOR + call("get_weather", {"city": "Oslo"}))
    assert not xgr_check(tag, TOOL_CALL_OPEN + '{"name":"add", "arguments": {"a": "x"')


def test_xgrammar_required_allows_only_calls(xgr_check: Any) -> None:
    tag = structural_tag(TurnSpec("required", PARAMS, parallel=False))
    assert xgr_check(tag, call("add", {"a": 1, "b": 2}))
    assert not xgr_check(tag, "I would rather talk.")
    assert not xgr_check(tag, call("add", {"a": 1, "b": 2}) + CALL_SEPARATOR)  # one call only
    parallel = structural_tag(TurnSpec("required", PARAMS, parallel=True))
    assert xgr_check(parallel, call("add", {"a": 1, "b": 2}) + CALL_SEPARATOR)


def test_guidance_grammar_enforces_the_same_turns() -> None:
    llg = pytest.importorskip("llguidance")
    from loopstack.serving.constraint.guidance import _ByteTokenizer

    tok = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))

    def accepts(spec: TurnSpec, text: str) -> bool:
        m = llg.LLMatcher(tok, llg.grammar_from("grammar", lark_grammar(spec)))
        return bool(m.consume_tokens(list(text.encode()))) and not m.is_error()

    auto = TurnSpec("auto", PARAMS, parallel=True)
    # the arguments on one line with the usual separators (free whitespace: loops)
    one_line = FENCED.replace('{\n    "city": "Paris",\n    "days": 5\n  }', PARIS_LINE)
    assert one_line != FENCED and accepts(auto, one_line)
    assert not accepts(auto, FENCED)
    assert not accepts(auto, one_line.replace('", "', '",   "'))
    assert not accepts(auto, one_line.replace('"days": 5', '"days": 9'))
    assert accepts(auto, CODE_BLOCK)
    # a call begun with a tool of the family that is not offered must become an offered one
    # after a call only its tail: no text, no second call unless in another <tool_call> tag
    assert accepts(auto, one_line + "\n")
    assert not accepts(auto, one_line + "\nHope this helps.")
    bare = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert not accepts(auto, bare + "\n" + bare)
    tagged = TOOL_CALL_OPEN + bare + CALL_SEPARATOR + bare + TOOL_CALL_CLOSE
    assert accepts(auto, tagged)
    assert not accepts(TurnSpec("auto", PARAMS, parallel=False), tagged)
    assert not accepts(auto, one_line.replace("get_weather", "get_temperature"))
    assert not accepts(auto, one_line.replace("get_weather", "get_weather_v2"))
    required = TurnSpec("required", PARAMS, parallel=True)
    add = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert accepts(required, add + CALL_SEPARATOR)
    assert not accepts(required, '{"name": "add", "arguments": {"a":1,"b":2}}')
    number = TurnSpec("required", {"n": {"type": "object", "properties": {"x": {
        "type": "number", "exclusiveMinimum": 0}}}}, parallel=False)  # fmt: skip
    assert accepts(number, '{"name": "n", "arguments": {"x": 0.000001}}')
    count = TurnSpec("required", {"n": {"type": "object", "properties": {"x": {
        "type": "integer", "minimum": 0}}}}, parallel=False)  # fmt: skip
    assert accepts(count, '{"name": "n", "arguments": {"x": 8999999999999999999}}')
    assert not accepts(count, '{"name": "n", "arguments": {"x": 10000000000000000000')  # digits
    assert not accepts(count, '{"name": "n", "arguments": {"x": -1}}')
    assert not accepts(number, '{"name": "n", "arguments": {"x": 0.0000001')  # finite decimals
    assert not accepts(required, "text")
    assert accepts(required, add + TOOL_CALL_CLOSE)  # then the end
    one = TurnSpec("required", PARAMS, parallel=True)
    for end in ("", TOOL_CALL_CLOSE, TOOL_CALL_CLOSE + "\n"):  # each may end the turn
        m = llg.LLMatcher(tok, llg.grammar_from("grammar", lark_grammar(one)))
        assert m.consume_tokens(list((add + end).encode())) and m.is_accepting(), end
    assert not accepts(required, add + TOOL_CALL_CLOSE + " more")


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
async def test_the_checker_refuses_what_the_backend_cannot_compile(backend: str) -> None:
    b = make_backend(backend, None, mode="thread")  # type: ignore[arg-type]
    good = TurnSpec("required", PARAMS, parallel=True)
    await b.constraint(good, what="tools")
    bad = TurnSpec("required", {"x": {"type": "string", "pattern": "[z-a]"}}, parallel=True)
    with pytest.raises(Exception, match="cannot be enforced"):
        await b.constraint(bad, what="tools")
    b.close()


def test_exactness_is_conservative() -> None:
    assert exact_for_grammar(PARAMS["get_weather"])
    assert not exact_for_grammar(EVEN["function"]["parameters"])
    assert not exact_for_grammar({"type": "string", "pattern": "^a+$"})


# --------------------------------------------------------------------------- ChatService
@pytest.fixture(params=["xgrammar", "guidance"])
async def grammar_harness(request: Any, make_harness: Callable[..., Harness]) -> Harness:
    backend: ConstraintBackend = make_backend(request.param, None, mode="thread")
    return make_harness(backend=backend)


@pytest.mark.parametrize("mode", ["auto", "required", "named"])
async def test_one_engine_request_per_turn(grammar_harness: Harness, mode: str) -> None:
    h = grammar_harness
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    choice = choice if mode == "named" else mode
    turn = FENCED if mode == "auto" else call("get_weather", {"city": "Paris", "days": 5})
    h.engine.constrained = [turn]
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice=choice)
    assert resp.status_code == 200, resp.text
    msg = resp.json()["choices"][0]["message"]
    [tc] = msg["tool_calls"]
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"city": "Paris", "days": 5}
    [sent] = h.engine.requests  # exactly one engine request
    so = sent[1]["structured_outputs"]
    assert set(so) == {"structural_tag"} or set(so) == {"grammar"}
    assert sent[1]["prompt"].endswith("assistant\n" + ("" if mode == "auto" else TOOL_CALL_OPEN))
    if mode == "named":  # only the named tool is in the constraint
        assert '"add"' not in json.dumps(so)
    assert resp.json()["choices"][0]["finish_reason"] == "tool_calls"


async def test_auto_text_answer_with_a_code_block_is_content(grammar_harness: Harness) -> None:
    h = grammar_harness
    h.engine.constrained = [CODE_BLOCK]
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="auto", stream=True)
    got = collect_stream(sse_events(resp.text))
    assert got["calls"] == []
    assert got["content"] == CODE_BLOCK
    assert len(h.engine.requests) == 1


async def test_streamed_auto_call_keeps_text_before_it(grammar_harness: Harness) -> None:
    h = grammar_harness
    h.engine.constrained = [FENCED]
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="auto", stream=True)
    got = collect_stream(sse_events(resp.text))
    assert got["content"] == "Sure, let me look.\n"
    [tc] = got["calls"]
    assert json.loads(tc["arguments"]) == {"city": "Paris", "days": 5}
    assert got["finish"] == "tool_calls"


async def test_inexact_schema_is_regenerated_then_refused(grammar_harness: Harness) -> None:
    h = grammar_harness
    h.engine.constrained = [call("set_even", {"n": 3}), call("set_even", {"n": 4})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required")
    assert resp.status_code == 200, resp.text
    [tc] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"n": 4}
    assert len(h.engine.requests) == 2
    assert h.engine.requests[1][1]["temperature"] >= 0.7
    h.engine.requests.clear()
    h.engine.constrained = [call("set_even", {"n": 3})]
    resp = await post_chat(h, tools=[EVEN], tool_choice="required")
    assert_openai_error(resp, 502)
    assert len(h.engine.requests) == 3


async def test_lookaround_pattern_is_refused_at_admission(make_harness: Any) -> None:
    for backend in ("xgrammar", "outlines"):
        h = make_harness(backend=make_backend(backend, None, mode="thread"))
        params = {"type": "object", "properties": {"s": {"type": "string",
                  "pattern": "^(?!z)(a|aa)*c$"}}}  # fmt: skip
        tool = {"type": "function", "function": {"name": "t", "parameters": params}}
        resp = await post_chat(h, tools=[tool], tool_choice="required")
        err = assert_openai_error(resp, 400)
        assert "lookaround" in err["message"] and err["param"] == "tools[0].function.parameters"
        assert h.engine.requests == []


async def test_a_cut_off_required_turn_shows_no_envelope_as_content(
    grammar_harness: Harness,
) -> None:
    h = grammar_harness
    h.engine.constrained = ['{"name": "']
    h.engine.finish_reason = "length"
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="required", max_tokens=4)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert not choice["message"]["content"] and not choice["message"].get("tool_calls")


@pytest.mark.parametrize(
    ("after", "finish"),
    [("", "tool_calls"), (TOOL_CALL_CLOSE, "tool_calls"), (CALL_SEPARATOR, "length"),
     (CALL_SEPARATOR + '{"name": "ad', "length")],
)  # fmt: skip
async def test_max_tokens_after_a_whole_call_is_a_tool_calls_turn(
    grammar_harness: Harness, after: str, finish: str
) -> None:
    """Cut after the last whole call (before the end token, after its closing tag):
    tool_calls; cut once another call has begun: length. Only whole calls come back."""
    h = grammar_harness
    h.engine.constrained = [call("add", {"a": 1, "b": 2}) + after]
    h.engine.finish_reason = "length"
    resp = await post_chat(h, tools=[WEATHER, ADD], tool_choice="required", max_tokens=40)
    choice = resp.json()["choices"][0]
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["add"]
    assert choice["finish_reason"] == finish


def test_stems_group_tool_families_and_never_shadow_each_other() -> None:
    assert stem_groups(["get_weather", "get_humidity", "add"]) == {
        "get_": ["get_weather", "get_humidity"],
        "add": ["add"],
    }
    # "get" (no separator) would fire before "get_" could be written: one group
    assert stem_groups(["get_weather", "get"]) == {"get": ["get_weather", "get"]}
    assert stem_groups(["a_b", "search-files", "mcp.time"]) == {
        "a_b": ["a_b"],
        "search-": ["search-files"],
        "mcp.": ["mcp.time"],
    }


def test_guidance_objects_take_only_their_listed_properties() -> None:
    from loopstack.serving.constraint.guidance import _finite_numbers

    closed = _finite_numbers({"type": "object", "properties": {"a": {"type": "string"}}})
    assert closed["additionalProperties"] is False
    for open_ in (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"a": {}}, "required": ["b"]},  # b: any value
        {"type": "object"},
    ):
        assert _finite_numbers(open_).get("additionalProperties") == open_.get(
            "additionalProperties"
        )


def test_guidance_patterns_match_the_whole_string() -> None:
    """A search pattern left the rest of the string free (the model filled it until
    max_tokens): the grammar reads an unanchored pattern as a whole-string match, a subset."""
    llg = pytest.importorskip("llguidance")
    from loopstack.serving.constraint.guidance import _ByteTokenizer, _finite_numbers

    tok = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))

    def accepts(pattern: str, value: str) -> bool:
        node = {"type": "string", "pattern": pattern}
        schema = {"type": "object", "properties": {"a": node}, "required": ["a"]}
        spec = TurnSpec("required", {"t": schema}, parallel=False)
        m = llg.LLMatcher(tok, llg.grammar_from("grammar", lark_grammar(spec)))
        call = json.dumps({"name": "t", "arguments": {"a": value}})
        return bool(m.consume_tokens(list(call.encode()))) and m.is_accepting()

    assert accepts("[a-z0-9]{3,5}", "ab12") and not accepts("[a-z0-9]{3,5}", "ab12-and-more")
    assert not accepts("[0-9]+", "x123y") and accepts("[0-9]+", "123")
    assert accepts("arn:.*", "arn:aws:s3") and not accepts("arn:.*", "my arn:aws")
    # a pattern that spells an anchor (or a negated class) keeps its own reading
    assert accepts("^id-", "id-anything after") and accepts("[^,]+", "a,b")
    node = {"type": "object", "properties": {"pattern": {"type": "string", "pattern": "a|b"}}}
    assert _finite_numbers(node)["properties"]["pattern"]["pattern"] == "^(?:a|b)$"


async def test_a_pattern_the_library_cannot_compile_is_validated_instead() -> None:
    """llguidance refuses ``^`` inside an alternation; the rest of the schema is enforced and
    the pattern is left to validation, not a 400 for a schema OpenAI accepts."""
    from loopstack.serving.constraint.backend import without_patterns

    schema = {"type": "object", "properties": {"arn": {"type": "string",  # from the corpus
              "minLength": 1, "maxLength": 115,
              "pattern": ".*(^waba-.*$)|(^arn:.*:waba/[0-9a-zA-Z]+$).*"},
              "pattern": {"type": "string"}}}  # fmt: skip
    spec = TurnSpec("required", {"tag": schema}, parallel=False)
    relaxed = without_patterns(spec)
    assert relaxed is not None and "pattern" not in relaxed.tools["tag"]["properties"]["arn"]
    assert "pattern" in relaxed.tools["tag"]["properties"]  # a property named pattern stays
    assert without_patterns(relaxed) is None
    backend = make_backend("guidance", None, mode="thread")
    body = await backend.constraint(spec, what="tools")
    assert "waba" not in body["grammar"] and '"arn"' in body["grammar"]


def test_schema_transforms_walk_named_properties_as_schemas() -> None:
    """A property may be named like a keyword: its schema is still walked, the map never
    read as a schema (one walk, `map_schema`, under every backend's transform)."""
    from loopstack.serving.constraint.backend import without_patterns
    from loopstack.serving.constraint.guidance import _finite_numbers
    from loopstack.serving.constraint.xgrammar import relaxed

    tricky = {"type": "object", "properties": {
        "enum": {"type": "string", "pattern": "^a+$", "maxLength": 500},
        "type": {"type": "number"}}}  # fmt: skip
    spec = without_patterns(TurnSpec("required", {"t": tricky}, parallel=False))
    assert spec is not None and "pattern" not in spec.tools["t"]["properties"]["enum"]
    assert "maxLength" not in relaxed(tricky)["properties"]["enum"]
    tight = _finite_numbers(tricky)
    assert tight["properties"]["type"]["multipleOf"] == 0.000001
    assert "multipleOf" not in tight["properties"] and "enum" in tight["properties"]
