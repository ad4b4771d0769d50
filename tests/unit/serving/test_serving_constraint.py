"""loopstack.serving.constraint: numeric range regexes, JSON-schema regexes, the tool-call envelope.

Regexes are checked with Python's `re` (Outlines regexes are Python-compatible) by fullmatching
candidate documents: every valid candidate that the regex claims must really be valid (the
regex never lets an invalid value through), and for exactly-expressible cases every valid
candidate must match too.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from loopstack.serving.constraint.patterns import int_range_regex, number_range_regex, regex_literal
from loopstack.serving.constraint.schema_regex import (
    CompiledSchema,
    compile_schema,
    tool_call_regex,
)
from loopstack.serving.exceptions import InvalidRequest


def dumps(value: Any) -> str:
    """How the model writes JSON under the regex: compact separators, raw UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def matches(c: CompiledSchema, value: Any) -> bool:
    return re.fullmatch(c.regex, dumps(value)) is not None


def assert_sound(c: CompiledSchema, candidates: list[Any]) -> None:
    """No candidate the regex accepts may fail the schema (when the regex is claimed exact)."""
    for v in candidates:
        if matches(c, v):
            assert c.exact is False or not c.errors(v), f"regex accepts invalid {dumps(v)}"


# --------------------------------------------------------------------------- integer ranges
BOUNDS = [None, -1000, -101, -100, -99, -57, -10, -9, -1, 0, 1, 7, 9, 10, 11, 99, 100, 101, 999]
WINDOW = range(-1100, 1101)


def _int_pairs() -> list[tuple[int | None, int | None]]:
    pairs = [(lo, hi) for lo, hi in itertools.product(BOUNDS, BOUNDS)]
    pairs = [(lo, hi) for lo, hi in pairs if lo is None or hi is None or lo <= hi]
    rng = random.Random(1234)
    for _ in range(40):
        a, b = sorted(rng.randint(-5000, 5000) for _ in range(2))
        pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("lo,hi", _int_pairs())
def test_int_range_regex_is_exact_on_a_window(lo: int | None, hi: int | None) -> None:
    rx = re.compile(f"({int_range_regex(lo, hi)})")
    extra = [v for b in (lo, hi) if b is not None for v in (b - 1, b, b + 1)]
    for v in itertools.chain(WINDOW, extra, [10**12, -(10**12), 123456789]):
        inside = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert (rx.fullmatch(str(v)) is not None) == inside, (lo, hi, v)


@pytest.mark.parametrize("lo,hi", [(None, None), (-50, 50), (0, 100), (None, 5), (-5, None)])
def test_int_range_regex_rejects_non_canonical_integers(lo: int | None, hi: int | None) -> None:
    rx = re.compile(f"({int_range_regex(lo, hi)})")
    for s in ["01", "-01", "00", "+1", "1.0", "1e2", " 1", "1 ", "", "-", "--1", "0x1", "1_0"]:
        assert rx.fullmatch(s) is None, s


# --------------------------------------------------------------------------- number ranges
def _decimal_strings(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        ip = rng.choice([0, 1, 2, 5, 9, 10, 11, 99, 100, 101, 150, 999, 1000, rng.randint(0, 3000)])
        sign = rng.choice(["", "-"])
        frac = rng.choice(["", ".0", ".00", ".5", ".05", "." + str(rng.randint(0, 10**6))])
        out.append(f"{sign}{ip}{frac}")
    return out


NUMBER_BOUNDS = [None, -1000, -100, -11, -10, -1, 0, 1, 10, 11, 100, 999]


@pytest.mark.parametrize(
    "lo,hi",
    [
        (lo, hi)
        for lo, hi in itertools.product(NUMBER_BOUNDS, NUMBER_BOUNDS)
        if lo is None or hi is None or lo <= hi
    ],
)
def test_number_range_regex_is_exact_for_plain_decimals(lo: int | None, hi: int | None) -> None:
    rx = re.compile(f"({number_range_regex(lo, hi)})")
    rng = random.Random(hash((lo, hi)) & 0xFFFF)
    cands = _decimal_strings(rng, 300)
    for b in (lo, hi):
        if b is not None:
            cands += [str(b), f"{b}.0", f"{b}.000", f"{b}.0001", f"{b - 1}.9999", f"{b + 1}"]
    for s in cands:
        v = Decimal(s)
        inside = (lo is None or v >= lo) and (hi is None or v <= hi)
        ok = rx.fullmatch(s) is not None
        if ok:
            assert inside, f"{s} accepted by [{lo}, {hi}]"
        elif inside:  # the only value written two ways: -0 (as -0.x) is never emitted
            assert v == 0 and s.startswith("-"), f"{s} rejected by [{lo}, {hi}]"


def test_number_range_regex_never_matches_exponents_or_junk() -> None:
    rx = re.compile(f"({number_range_regex(-10, 10)})")
    for s in ["1e1", "1E0", "5.", ".5", "01.5", "+1", "1.5.5", "NaN", "Infinity", "- 1"]:
        assert rx.fullmatch(s) is None, s


# --------------------------------------------------------------------------- schema bounds
def _number_candidates(rng: random.Random) -> list[Any]:
    vals: list[Any] = [0, 0.5, 1, -1, 2.25, 100, -100, 1.0, 3.75, 1e3]
    vals += [round(rng.uniform(-30, 30), rng.randint(0, 4)) for _ in range(200)]
    vals += [rng.randint(-30, 30) for _ in range(100)]
    return vals


@pytest.mark.parametrize("seed", range(40))
def test_schema_numeric_bounds_never_admit_out_of_range_values(seed: int) -> None:
    rng = random.Random(seed)
    kind = rng.choice(["integer", "number"])
    node: dict[str, Any] = {"type": kind}
    for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        if rng.random() < 0.5:
            node[key] = rng.choice([rng.randint(-20, 20), round(rng.uniform(-20, 20), 2)])
    schema = {"type": "object", "properties": {"x": node}, "required": ["x"]}
    try:
        c = compile_schema(schema)
    except InvalidRequest:  # only a range with no value at all may be refused
        pts = sorted(v for k, v in node.items() if k != "type")
        cands = [*pts, *(p + d for p in pts for d in (-1, 1)), *range(-22, 23)]
        cands += [(a + b) / 2 for a, b in itertools.pairwise(pts)]
        assert not any(Draft202012Validator(node).is_valid(v) for v in cands), node
        return
    assert c.exact or kind == "number"  # only a range with no integer in it is validated
    assert_sound(c, [{"x": v} for v in _number_candidates(rng)])
    if kind == "integer":  # integer bounds are exact: every valid integer is reachable
        for v in range(-40, 41):
            assert matches(c, {"x": v}) == (not c.errors({"x": v})), (node, v)


@pytest.mark.parametrize(
    "node,inside",
    [
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.5),
        ({"type": "number", "minimum": 0.1, "maximum": 0.9}, 0.5),
        ({"type": "number", "minimum": 2.5, "maximum": 2.75}, 2.6),
    ],
)
def test_narrow_non_integral_number_range_is_not_refused(node: dict[str, Any], inside: float):
    """A probability in (0, 1) is a valid, common schema: it must not be a 400."""
    c = compile_schema({"type": "object", "properties": {"p": node}, "required": ["p"]})
    assert not c.errors({"p": inside})
    assert_sound(c, [{"p": v} for v in (-1, 0, 1, 2, 3, 0.5, 2.6, 10)])


def test_number_range_with_no_value_is_refused() -> None:
    for node in (
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        {"type": "integer", "minimum": 5, "maximum": 4},
        {"type": "number", "minimum": 5, "maximum": 4},
        {"type": "number", "minimum": 1, "exclusiveMaximum": 1},
        {"type": "integer", "minimum": 0.2, "maximum": 0.8},
    ):
        with pytest.raises(InvalidRequest):
            compile_schema(node)


def test_nullable_type_list_with_bounds_is_not_claimed_exact_unless_enforced() -> None:
    c = compile_schema({"type": ["integer", "null"], "minimum": 5, "maximum": 9})
    assert not c.errors(7) and not c.errors(None) and c.errors(100)
    assert matches(c, 7) and matches(c, None)
    assert_sound(c, [100, 4, 10, -7, 0])


# --------------------------------------------------------------------------- whole schemas
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name. " + "Long description. " * 300},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "ratio": {"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}

NESTED = {
    "type": "object",
    "$defs": {
        "point": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -10, "maximum": 10},
                "y": {"type": "integer", "minimum": -10, "maximum": 10},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        }
    },
    "properties": {
        "path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1},
        "meta": {
            "type": "object",
            "properties": {
                "label": {"type": "string", "maxLength": 8},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            },
            "required": ["label"],
            "additionalProperties": False,
        },
        "mode": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"type": "null"}]},
    },
    "required": ["path"],
    "additionalProperties": False,
}

UNICODE = {
    "type": "object",
    "properties": {
        "città": {"type": "string", "enum": ["Zürich", "東京", "São Paulo", 'say "hi"']},
        "größe": {"type": "integer", "minimum": 0, "maximum": 250},
    },
    "required": ["città"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "schema,valid,invalid",
    [
        (
            WEATHER,
            [
                {"city": "Paris", "days": 3},
                {"city": "Paris", "unit": "celsius", "days": 14},
                {"city": 'a "quoted" {brace} \\ name', "days": 1, "ratio": 1.5},
                {"city": "x", "unit": "fahrenheit", "days": 7, "ratio": -0.75},
                {"city": "x", "days": 1, "ratio": 0},
            ],
            [
                {"city": "Paris"},
                {"days": 3},
                {"city": "Paris", "days": 0},
                {"city": "Paris", "days": 15},
                {"city": "Paris", "days": -1},
                {"city": "Paris", "days": 3.5},
                {"city": "Paris", "days": 3, "unit": "kelvin"},
                {"city": "Paris", "days": 3, "extra": 1},
                {"city": "Paris", "days": 3, "ratio": 3},
                {"city": "Paris", "days": 3, "ratio": -2},
                {"city": "Paris", "days": 3, "ratio": 7.5},
                {"city": 5, "days": 3},
            ],
        ),
        (
            NESTED,
            [
                {"path": [{"x": 0, "y": 0}]},
                {"path": [{"x": -10, "y": 10}, {"x": 3, "y": -4}], "meta": {"label": "ok"}},
                {"path": [{"x": 1, "y": 2}], "meta": {"label": "abcdefgh", "tags": ["a", "b"]}},
                {"path": [{"x": 1, "y": 2}], "mode": 3},
                {"path": [{"x": 1, "y": 2}], "mode": None},
            ],
            [
                {"path": []},
                {"path": [{"x": 11, "y": 0}]},
                {"path": [{"x": 0}]},
                {"path": [{"x": 0, "y": 0, "z": 0}]},
                {"path": [{"x": 0, "y": 0}], "meta": {"label": "abcdefghi"}},
                {"path": [{"x": 0, "y": 0}], "meta": {"tags": ["a"]}},
                {"path": [{"x": 0, "y": 0}], "meta": {"label": "x", "tags": ["c"]}},
                {"path": [{"x": 0, "y": 0}], "mode": 4},
                {"path": [{"x": 0, "y": 0}], "mode": -1},
            ],
        ),
        (
            UNICODE,
            [
                {"città": "Zürich"},
                {"città": "東京", "größe": 250},
                {"città": 'say "hi"', "größe": 0},
            ],
            [
                {"città": "Zurich"},
                {"città": "東京", "größe": 251},
                {"größe": 3},
                {"citta": "Zürich"},
            ],
        ),
    ],
    ids=["weather", "nested", "unicode"],
)
def test_compile_schema_accepts_valid_and_rejects_invalid(
    schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    c = compile_schema(schema)
    assert c.exact
    for v in valid:
        assert not c.errors(v), v
        assert matches(c, v), dumps(v)
    for v in invalid:
        assert c.errors(v), v
        assert not matches(c, v), dumps(v)


def test_compile_schema_leaves_the_input_schema_untouched() -> None:
    before = json.dumps(NESTED, sort_keys=True)
    c = compile_schema(NESTED)
    assert json.dumps(NESTED, sort_keys=True) == before
    assert c.schema == NESTED
    assert "LSNUMRANGE" not in c.regex


def test_regex_output_parses_as_json() -> None:
    """Strings assembled along the regex's alternatives parse and validate."""
    c = compile_schema(WEATHER)
    for days, unit, ratio in itertools.product(range(1, 15), ["celsius", None], ["-0.5", None]):
        parts = ['"city": "Lyon"']
        if unit:
            parts.append(f'"unit": "{unit}"')
        parts.append(f'"days": {days}')
        if ratio:
            parts.append(f'"ratio": {ratio}')
        for sep, colon in [(",", ":")]:  # compact: the regex admits no whitespace
            text = "{" + sep.join(parts).replace(": ", colon) + "}"
            assert re.fullmatch(c.regex, text), text
            assert not c.errors(json.loads(text))


@pytest.mark.parametrize(
    "schema,invalid",
    [
        ({"type": "integer", "multipleOf": 3}, [4]),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [[1, 1]]),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
            [{"a": 3}],
        ),
        ({"type": "array", "items": {"type": "array", "uniqueItems": True}}, [[[1, 1]]]),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, [5]),
        (
            {
                "oneOf": [
                    {"type": "integer", "minimum": 0, "maximum": 10},
                    {"type": "integer", "minimum": 5, "maximum": 20},
                ]
            },
            [7],
        ),
    ],
)
def test_inexact_schemas_are_marked(schema: dict[str, Any], invalid: list[Any]) -> None:
    c = compile_schema(schema)
    assert c.exact is False
    for v in invalid:
        assert c.errors(v)


def test_one_branch_one_of_stays_exact() -> None:
    c = compile_schema({"oneOf": [{"type": "integer", "minimum": 0, "maximum": 3}]})
    assert c.exact
    assert matches(c, 3) and not matches(c, 4)


def test_all_of_with_several_branches_is_never_unsound() -> None:
    """outlines_core concatenates allOf branches (so "15" matches as "1" + "5")."""
    schema = {
        "allOf": [
            {"type": "integer", "minimum": 0, "maximum": 10},
            {"type": "integer", "minimum": 5, "maximum": 20},
        ]
    }
    try:
        c = compile_schema(schema)
    except InvalidRequest:
        return
    assert_sound(c, list(range(-5, 40)))


@pytest.mark.parametrize(
    "schema",
    [
        [],
        "object",
        None,
        {"type": "no-such-type"},
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": "zero"}}},
        {"type": "object", "required": "a"},
        {"type": "string", "minLength": -1},
        {"type": "integer", "minimum": 9, "maximum": 1},
    ],
)
def test_invalid_schemas_raise_invalid_request(schema: Any) -> None:
    with pytest.raises(InvalidRequest):
        compile_schema(schema, what="tools[0].function.parameters")


def test_invalid_schema_message_names_what() -> None:
    with pytest.raises(InvalidRequest, match=r"tools\[3\]\.function\.parameters"):
        compile_schema({"type": 5}, what="tools[3].function.parameters")


@pytest.mark.parametrize("key", ['say "hi"', "back\\slash"])
def test_property_names_that_need_json_escapes(key: str) -> None:
    c = compile_schema({"type": "object", "properties": {key: {"type": "integer"}}})
    assert matches(c, {key: 1})


# --------------------------------------------------------------------------- tool envelope
def _tools() -> dict[str, CompiledSchema]:
    return {
        "get_weather": compile_schema(WEATHER),
        "add": compile_schema(
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            }
        ),
    }


def _call(name: str, args: Any) -> str:
    return '{"name": "' + name + '", "arguments": ' + dumps(args) + "}"


def test_tool_call_regex_single_call() -> None:
    rx = re.compile(tool_call_regex(_tools(), parallel=False))
    one = _call("add", {"a": 1, "b": -2})
    assert rx.fullmatch(one)
    assert rx.fullmatch(one + "\n</tool_call>")
    assert rx.fullmatch(_call("get_weather", {"city": "Oslo", "days": 2}))
    assert not rx.fullmatch(one + "\n</tool_call>\n<tool_call>\n" + one)
    assert not rx.fullmatch(_call("add", {"a": 1}))
    assert not rx.fullmatch(_call("get_weather", {"city": "Oslo", "days": 99}))
    assert not rx.fullmatch(_call("nope", {"a": 1, "b": 2}))
    assert not rx.fullmatch(_call("add", {"a": 1, "b": 2}) + "trailing")
    # The arguments of one tool do not fit another tool's name.
    assert not rx.fullmatch(_call("add", {"city": "Oslo", "days": 2}))


def test_tool_call_regex_parallel_allows_opening_the_next_call() -> None:
    """With parallel calls the regex holds one call, optionally followed by the opening of
    the next; the server continues generation from there under the same regex."""
    rx = re.compile(tool_call_regex(_tools(), parallel=True))
    a = _call("add", {"a": 1, "b": 2})
    w = _call("get_weather", {"city": "Oslo", "days": 2})
    for text in [a, w, a + "\n</tool_call>", a + "\n</tool_call>\n<tool_call>\n"]:
        assert rx.fullmatch(text), text
    for text in [
        a + "\n<tool_call>\n",
        a + "\n</tool_call>\n<tool_call>",
        a + "\n" + w,
        _call("get_weather", {"city": "Oslo", "days": 0}) + "\n</tool_call>",
    ]:
        assert not rx.fullmatch(text), text
    single = re.compile(tool_call_regex(_tools(), parallel=False))
    assert not single.fullmatch(a + "\n</tool_call>\n<tool_call>\n")


def test_tool_names_are_regex_escaped() -> None:
    schema = compile_schema({"type": "object", "properties": {}})
    rx = re.compile(tool_call_regex({"a.b-c": schema}, parallel=False))
    assert rx.fullmatch(_call("a.b-c", {}))
    assert not rx.fullmatch(_call("aXb-c", {}))
    for text in ["a.b", "x|y", "(a)", "[x]", "{1}", "a*b+c?", "^$", "\\", "/"]:
        assert re.fullmatch(regex_literal(text), text)


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        ("^arn:aws:x:.+", "arn:aws:x:abc", 'arn:aws:x:a"b'),
        ("^[a-z]+$", "abc", "ab1"),
        (".*\\S.*", "a b", "   "),
        ("[^x]+", "abc", 'a"c'),
        ("[a-z]+|^\\$next", "$next", 'abc,"x'),
        ("[\\S\\s]+", "any text", 'a"b'),
        ("[a-z\\s]+", "a b", "a\\tb"),
    ],
)
def test_patterns_are_json_safe_and_unanchored(pattern: str, good: str, bad: str) -> None:
    c = compile_schema(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    )
    assert re.fullmatch(c.regex, json.dumps({"s": good}, separators=(",", ":")))
    assert not re.fullmatch(c.regex, '{"s":"' + bad + '"}')


def test_large_counted_bounds_are_left_to_validation() -> None:
    c = compile_schema(
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": 1024}}}
    )
    assert not c.exact and "1024" not in c.regex
    assert c.errors({"s": "x" * 1025}) and not c.errors({"s": "x" * 10})


def test_pattern_wins_over_lengths() -> None:
    """Outlines drops `pattern` when min/maxLength are present; we keep the pattern."""
    schema = {
        "type": "object",
        "properties": {
            "id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 50,
                "pattern": "^hrc-[a-z0-9]{12}$",
            }
        },
        "required": ["id"],
    }
    c = compile_schema(schema)
    assert re.fullmatch(c.regex, '{"id":"hrc-abcdef123456"}')
    assert not re.fullmatch(c.regex, '{"id":"arc-511eadd7"}')
    assert not c.exact  # the lengths are checked after generation
