"""Adversarial schemas in `required` mode and as `response_format`: what comes back validates."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from typing import Any

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from tests.integration.conftest import Server, send_at_once

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ADVERSARIAL: dict[str, tuple[dict[str, Any], str]] = {
    "nested": (
        {
            "type": "object",
            "properties": {
                "order": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "customer": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
                            "required": ["name", "vip"],
                        },
                    },
                    "required": ["id", "customer"],
                }
            },
            "required": ["order"],
        },
        "Record order A-17 for customer Ann, who is a VIP.",
    ),
    "array_of_objects": (
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 10},
                        },
                        "required": ["sku", "qty"],
                    },
                }
            },
            "required": ["items"],
        },
        "Add 2 of SKU X1 and 40 of SKU Y2 to the cart.",
    ),
    "enum_and_bounds": (
        {
            "type": "object",
            "properties": {
                "level": {"type": "string", "enum": ["low", "medium", "high"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "temp": {"type": "integer", "minimum": -40, "maximum": -10},
                "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
            },
            "required": ["level", "score", "temp", "ratio"],
        },
        "Set the alert to extreme, score 250, temperature 30 and ratio 0.",
    ),
    "optional_and_closed": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                "priority": {"type": "integer"},
            },
            "required": ["title"],
            "additionalProperties": False,
        },
        "Create a ticket titled 'Printer on fire' with tags urgent and hardware.",
    ),
    "unicode": (
        {
            "type": "object",
            "properties": {
                "städte": {"type": "array", "items": {"type": "string"}},
                "sprache": {"type": "string", "enum": ["deutsch", "français", "日本語"]},
            },
            "required": ["städte", "sprache"],
        },
        "Liste München und Köln auf, auf Japanisch.",
    ),
    "long_description": (
        {
            "type": "object",
            "description": "A query. " + "Be precise and follow the instructions. " * 60,
            "properties": {
                "query": {"type": "string", "description": "Search text. " * 40},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["query", "limit"],
        },
        "Search for cheap flights to Oslo, show me 500 results.",
    ),
    "defs_ref_anyof": (
        {
            "type": "object",
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"],
                }
            },
            "properties": {
                "shape": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "string"}]},
                "when": {"type": "string", "format": "date"},
            },
            "required": ["shape", "when"],
        },
        "Draw a point at 3,4 on the 5th of May 2026.",
    ),
    # Real-world shapes (botocore) that used to be refused as too complex: optional objects
    # nested in optional objects, maps of free-form objects, a class spanning '"' and '\'.
    "optional_nested_and_free_form": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "throttle": {
                    "type": "object",
                    "properties": {
                        "burstLimit": {"type": "integer", "minimum": 0, "maximum": 5000},
                        "rateLimit": {"type": "number"},
                        "window": {
                            "type": "object",
                            "properties": {
                                "unit": {"type": "string", "enum": ["SECOND", "MINUTE"]},
                                "length": {"type": "integer", "minimum": 1, "maximum": 60},
                            },
                        },
                    },
                },
                "stages": {"type": "object", "additionalProperties": {"type": "object"}},
                "origins": {
                    "type": "array",
                    "items": {"type": "string", "pattern": "[\\u0009\\u0020-\\u00FF]+"},
                },
                "extra": {},
            },
            "required": ["name"],
        },
        "Create a usage plan named gold allowing bursts of 200 requests per second, for the "
        "origin https://example.com.",
    ),
}


RESPONSE_FORMAT = ["enum_and_bounds", "optional_and_closed", "unicode"]


@pytest.fixture(scope="module")
def replies(client: OpenAI, server: Server) -> dict[tuple[str, str], Future[Any]]:
    """Every schema's request at once (11 one after the other took ~55 s of `make test` in
    float32)."""
    requests: dict[tuple[str, str], dict[str, Any]] = {}
    for name, (schema, prompt) in ADVERSARIAL.items():
        tool = {"type": "function", "function": {"name": f"do_{name}", "parameters": schema}}
        requests["required", name] = {
            "messages": [{"role": "user", "content": prompt}],
            "tools": [tool], "tool_choice": "required", "max_tokens": 200,
        }  # fmt: skip
    for name in RESPONSE_FORMAT:
        schema, prompt = ADVERSARIAL[name]
        requests["json_schema", name] = {
            "messages": [{"role": "user", "content": prompt + " Answer in JSON."}],
            "response_format": {
                "type": "json_schema", "json_schema": {"name": name, "schema": schema}
            },
            "max_tokens": 160,
        }  # fmt: skip
    for kw in requests.values():
        kw.update(model=server.model, temperature=0)
    return send_at_once(client, requests)


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_required_mode_validates(replies: dict[tuple[str, str], Future[Any]], name: str) -> None:
    schema, _ = ADVERSARIAL[name]
    r = replies["required", name].result()
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls", r
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("name", RESPONSE_FORMAT)
def test_response_format_json_schema(
    replies: dict[tuple[str, str], Future[Any]], name: str
) -> None:
    schema, _ = ADVERSARIAL[name]
    r = replies["json_schema", name].result()
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_a_pathological_automaton_is_answered_quickly(client: OpenAI, server: Server) -> None:
    """(a|b)*a(a|b){15} is 34 characters of pattern and 2**16 DFA states: the outlines backend
    refuses it with a 400 before vLLM starts minutes of compilation; llguidance (the default)
    matches patterns lazily and serves it. Either way within seconds, and the server stays
    healthy."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": "(a|b)*a(a|b){15}"}},
        "required": ["s"],
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    started = time.monotonic()
    try:
        resp = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "go"}],
            tools=[tool], tool_choice="required", max_tokens=20,
        )  # fmt: skip
    except BadRequestError as err:
        assert err.code == "schema_too_complex"
        assert "automaton" in err.message
    else:  # served: a length cut-off or a call that validates
        for call in resp.choices[0].message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), schema)
        assert resp.choices[0].finish_reason in ("length", "tool_calls")
    assert time.monotonic() - started < 60
    r = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=5
    )
    assert r.choices[0].message.content
