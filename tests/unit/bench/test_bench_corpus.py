"""Sanity of the committed tool-schema corpus and of the corpus builder's helpers."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from loopstack.bench.common import CORPUS_PATH, load_corpus
from loopstack.bench.corpus import build as tc
from loopstack.bench.corpus import text as ct


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return load_corpus()


def test_corpus_size_and_sources(corpus: list[dict]) -> None:
    assert 300 <= len(corpus) <= 500
    assert CORPUS_PATH.stat().st_size < 2_000_000
    sources = {e["source"] for e in corpus}
    assert sources == {"botocore", "mcp"}
    assert len({e["id"] for e in corpus}) == len(corpus)


def test_every_entry_is_well_formed(corpus: list[dict]) -> None:
    names = [e["tool"]["function"]["name"] for e in corpus]
    assert len(set(names)) == len(names)
    known = set(names)
    for e in corpus:
        fn = e["tool"]["function"]
        assert e["tool"]["type"] == "function"
        assert tc.NAME_RE.match(fn["name"]), fn["name"]
        assert 0 < len(fn["description"]) <= ct.MAX_DESCRIPTION
        params = fn["parameters"]
        Draft202012Validator.check_schema(params)
        assert params["type"] == "object"
        assert e["prompt"].strip()
        assert len(e["distractors"]) == 2
        assert fn["name"] not in e["distractors"]
        assert set(e["distractors"]) <= known
        assert e["provenance"]["package"]


def test_feature_mix(corpus: list[dict]) -> None:
    stats = tc.summarize(corpus)["features"]
    for key in ("enum", "numeric_bounds", "nested_object", "array_of_objects", "optional"):
        assert stats[key] >= 50, (key, stats)


def test_mcp_tools_present(corpus: list[dict]) -> None:
    names = {e["tool"]["function"]["name"] for e in corpus if e["source"] == "mcp"}
    assert {"get_current_time", "convert_time", "git_status", "fetch"} <= names


SHAPES: dict[str, dict[str, Any]] = {
    "In": {
        "type": "structure",
        "required": ["Name"],
        "members": {
            "Name": {"shape": "Str", "documentation": "<p>The <b>name</b>. More text.</p>"},
            "Mode": {"shape": "ModeEnum"},
            "Max": {"shape": "Bounded"},
            "Tags": {"shape": "TagList"},
            "Attrs": {"shape": "AttrMap"},
            "When": {"shape": "Ts"},
            "Body": {"shape": "Blob"},
            "Deep": {"shape": "L1"},
        },
    },
    "Str": {"type": "string", "min": 1, "max": 64, "pattern": "[a-z0-9-]+"},
    "ModeEnum": {"type": "string", "enum": ["FAST", "SLOW"]},
    "Bounded": {"type": "integer", "min": 1, "max": 100},
    "TagList": {"type": "list", "member": {"shape": "Tag"}, "max": 5},
    "Tag": {
        "type": "structure",
        "required": ["Key"],
        "members": {"Key": {"shape": "Str"}, "Value": {"shape": "Str"}},
    },
    "AttrMap": {"type": "map", "key": {"shape": "Str"}, "value": {"shape": "Str"}},
    "Ts": {"type": "timestamp"},
    "Blob": {"type": "blob"},
    "L1": {"type": "structure", "members": {"Next": {"shape": "L2"}}},
    "L2": {"type": "structure", "members": {"Next": {"shape": "L3"}}},
    "L3": {"type": "structure", "members": {"X": {"shape": "Str"}}},
    "Rec": {"type": "structure", "members": {"Child": {"shape": "Rec"}}},
}


def test_shape_conversion() -> None:
    schema = tc.ShapeConverter(SHAPES, max_depth=3).convert("In")
    Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert schema["required"] == ["Name"]
    assert props["Name"]["description"] == "The name."
    assert props["Name"]["minLength"] == 1 and props["Name"]["maxLength"] == 64
    assert props["Name"]["pattern"] == "[a-z0-9-]+"
    assert props["Mode"] == {"type": "string", "enum": ["FAST", "SLOW"]}
    assert props["Max"] == {"type": "integer", "minimum": 1, "maximum": 100}
    assert props["Tags"]["type"] == "array" and props["Tags"]["maxItems"] == 5
    assert props["Tags"]["items"]["required"] == ["Key"]
    assert props["Attrs"]["additionalProperties"]["type"] == "string"
    assert props["When"] == {"type": "string", "format": "date-time"}
    assert props["Body"] == {"type": "string"}
    # depth cap: In(0) -> L1(1) -> L2(2) -> L3 would be depth 3: becomes a bare object
    assert props["Deep"]["properties"]["Next"]["properties"]["Next"] == {"type": "object"}
    feats = ct.schema_features(schema)
    for key in ("enum", "numeric_bounds", "array_of_objects", "map", "optional", "format"):
        assert feats[key], key


def test_recursive_shape_rejected() -> None:
    with pytest.raises(tc.Recursive):
        tc.ShapeConverter(SHAPES).convert("Rec")


def test_text_helpers() -> None:
    assert ct.first_sentence("<p>Creates a bucket. Then more.</p>") == "Creates a bucket."
    assert ct.first_sentence("Use e.g. this") == "Use e.g. this"
    long = ct.first_sentence("word " * 200, cap=50)
    assert len(long) <= 50 and long.endswith("…")
    assert ct.tool_name("bedrock-agent", "ListObjectsV2") == "bedrock_agent_list_objects_v2"
    assert ct.tool_name("s3", "GetBucketACL") == "s3_get_bucket_acl"
    assert len(ct.tool_name("x" * 40, "Y" * 40)) <= 64
    assert ct.imperative("Creates a new bucket.") == "create a new bucket"
    assert ct.imperative("Lists the tags.") == "list the tags"
    assert ct.imperative("Retries the job.") == "retry the job"
    assert ct.imperative("Describes addresses.") == "describe addresses"
    assert ct.imperative("Pushes the image.") == "push the image"


def test_prompt_has_required_values() -> None:
    params: dict[str, Any] = {
        "type": "object",
        "properties": {
            "timezone": {"type": "string"},
            "limit": {"type": "integer", "minimum": 5, "maximum": 9},
        },
        "required": ["timezone"],
    }
    prompt = ct.make_prompt("get the time", params, random.Random(0))
    assert "timezone" in prompt
    assert any(tz in prompt for tz in ("Europe/Berlin", "Asia/Tokyo", "America/Chicago"))
    value = ct.example_value("limit", params["properties"]["limit"], random.Random(0))
    assert 5 <= value <= 9


def test_jsonl_is_one_object_per_line_as_the_builder_writes_it() -> None:
    """One JSON object per line, serialized as `loopstack.bench.corpus.build` writes it (no indent,
    key order kept, UTF-8 unescaped), unique ids, a final newline: a hand edit that breaks any of
    these shows up here rather than as a diff of the whole file at the next rebuild."""
    text = CORPUS_PATH.read_text(encoding="utf-8")
    assert text.endswith("\n")
    ids = []
    for line in text.splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict)
        assert line == tc.corpus_line(entry)
        ids.append(entry["id"])
    assert len(ids) == len(set(ids))
