"""loopstack.serving.constraint: the object and free-form regexes built instead of Outlines'.

Objects are checked for the same language as Outlines' own regex (candidate documents:
every ordered subset of the properties, repeats, reorders, stray commas), and for size:
linear in the number of properties where Outlines' is quadratic per nesting level.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from outlines_core.json_schema import build_regex_from_schema

from loopstack.serving.constraint.patterns import json_value_regex
from loopstack.serving.constraint.schema_regex import FREE_FORM_DEPTH, compile_schema
from loopstack.serving.exceptions import InvalidRequest

CORPUS = Path(__file__).parents[3] / "loopstack" / "bench" / "corpus" / "tool_schemas.jsonl"
VALUES = {"a": 1, "b": "x", "c": True, "d": None}
TYPES = {"a": "integer", "b": "string", "c": "boolean", "d": "null"}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _object(names: str, required: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {n: {"type": TYPES[n]} for n in names},
    }
    if required:
        schema["required"] = list(required)
    return schema


def _candidates(names: str) -> list[str]:
    docs = []
    for k in range(len(names) + 1):
        for subset in itertools.permutations(names, k):
            docs.append("{" + ",".join(f'"{n}":{dumps(VALUES[n])}' for n in subset) + "}")
    first = f'"{names[0]}":{dumps(VALUES[names[0]])}'
    docs += ["{" + first + "," + first + "}", "{," + first + "}", "{" + first + ",}", "{,}"]
    return docs


@pytest.mark.parametrize(
    ("names", "required"),
    [("ab", ""), ("abc", ""), ("abcd", ""), ("abc", "b"), ("abcd", "ac"), ("abcd", "d")],
)
def test_objects_match_the_language_of_outlines(names: str, required: str) -> None:
    schema = _object(names, required)
    ours = compile_schema(schema).regex
    theirs = build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
    for doc in _candidates(names):
        assert bool(re.fullmatch(ours, doc)) == bool(re.fullmatch(theirs, doc)), doc


def test_optional_objects_grow_linearly() -> None:
    def nested(width: int, depth: int) -> dict[str, Any]:
        if depth == 0:
            return {"type": "string"}
        return {
            "type": "object",
            "properties": {f"p{i}": nested(width, depth - 1) for i in range(width)},
        }

    schema = nested(6, 3)
    ours = compile_schema(schema).regex
    theirs = build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
    # each level writes each property twice: 2**3 * 6**3 leaves, against Outlines' 21**3
    assert len(ours) < len(theirs) / 5
    doc = {"p1": {"p0": {"p5": "x"}, "p4": {}}, "p5": {"p2": {"p3": "y", "p4": "z"}}}
    assert re.fullmatch(ours, dumps(doc))
    assert not re.fullmatch(ours, dumps({"p5": {}, "p1": {}}))  # schema order


@pytest.mark.parametrize("key", ['say "hi"', "back\\slash", "tab\there", "ünï", "a.b*c"])
def test_property_names_are_json_escaped(key: str) -> None:
    c = compile_schema(
        {"type": "object", "properties": {key: {"type": "integer"}, "z": {"type": "null"}}}
    )
    assert re.fullmatch(c.regex, dumps({key: 1, "z": None}))
    assert re.fullmatch(c.regex, dumps({key: 1}))
    assert not re.fullmatch(c.regex, dumps({key: 1, key + "x": 1}))


def test_required_names_without_a_property_get_any_value() -> None:
    c = compile_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "id"]}
    )
    assert re.fullmatch(c.regex, '{"a":1,"id":"x"}')
    assert not re.fullmatch(c.regex, '{"a":1}')
    assert not c.errors({"a": 1, "id": [1]})


def test_boolean_property_schemas() -> None:
    c = compile_schema({"type": "object", "properties": {"a": True, "b": False, "c": {}}})
    assert re.fullmatch(c.regex, '{"a":[1,{"x":null}],"c":"y"}')
    assert not re.fullmatch(c.regex, '{"b":1}')
    with pytest.raises(InvalidRequest):
        compile_schema({"type": "object", "properties": {"b": False}, "required": ["b"]})


def test_definitions_are_rewritten_before_the_objects_that_use_them() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/A"},
            "z": {"type": "object", "properties": {"x": {"$ref": "#/$defs/B"}, "y": {}}},
        },
        "$defs": {
            "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}, "c": {}}},
            "B": {"type": "integer", "minimum": 5, "maximum": 9},
        },
    }
    c = compile_schema(schema)
    assert c.exact
    for doc, ok in [
        ({"a": {"b": 5}}, True),
        ({"a": {"b": 10}}, False),
        ({"z": {"x": 7, "y": "q"}}, True),
        ({"z": {"x": 70}}, False),
    ]:
        assert bool(re.fullmatch(c.regex, dumps(doc))) is ok, doc


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "object"}, [{}, {"a": [1, "x", None]}, {"a": {"b": 1.5e3}}], ["[]", "1"]),
        ({"type": "array"}, [[], [1, {"a": "b"}], [[True]]], ["{}", "[1,]"]),
        ({}, ["x", 1, None, [], {"a": [1]}], ["{,}", "tru"]),
        (
            {"type": "object", "additionalProperties": True, "description": "free"},
            [{"k": "v"}],
            ['{"k"}'],
        ),
    ],
)
def test_free_form_values(schema: dict[str, Any], good: list[Any], bad: list[str]) -> None:
    c = compile_schema({"type": "object", "properties": {"v": schema}, "required": ["v"]})
    for value in good:
        assert re.fullmatch(c.regex, dumps({"v": value})), value
    for text in bad:
        assert not re.fullmatch(c.regex, '{"v":' + text + "}"), text
    theirs = build_regex_from_schema(json.dumps(schema or {"type": "object"}))
    assert len(json_value_regex(FREE_FORM_DEPTH)) < len(theirs)


def test_free_form_depth_is_bounded() -> None:
    rx = json_value_regex(FREE_FORM_DEPTH)
    assert re.fullmatch(rx, dumps({"a": {"b": 1}}))
    assert not re.fullmatch(rx, dumps({"a": {"b": {"c": 1}}}))


def test_every_corpus_schema_compiles() -> None:
    """The 415 real-world schemas of the validity benchmark: none refused by the regex cap
    (before the object and free-form regexes, 35 were)."""
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    sizes = [len(compile_schema(e["tool"]["function"]["parameters"]).regex) for e in entries]
    assert len(sizes) == len(entries) >= 400
