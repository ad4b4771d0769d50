"""Client-supplied constraints on the real server: a pathological regex or schema gets a
quick 400 before vLLM sees it, /health stays fine meanwhile, an unsatisfiable schema is
``invalid_schema``, and an ordinary client regex still constrains the real model."""

from __future__ import annotations

import concurrent.futures
import re
import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import API_KEY, Server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PATHOLOGICAL = "(a|b)*a(a|b){19}"  # 2^20 DFA states: held vLLM's compile thread for 60 s


def deep_defs() -> dict[str, Any]:
    """5 KB; its regex would be 2 billion characters."""
    defs: dict[str, Any] = {
        "L3": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    }
    for name, inner in (("L2", "L3"), ("L1", "L2")):
        refs = {f"p{i}": {"$ref": f"#/$defs/{inner}"} for i in range(40)}
        defs[name] = {"type": "object", "properties": refs}
    refs = {f"p{i}": {"$ref": "#/$defs/L1"} for i in range(40)}
    return {"$defs": defs, "type": "object", "properties": refs}


def post(server: Server, path: str, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(server.base_url + path, headers=AUTH, json=body, timeout=timeout)


def refused_quickly_with_health(server: Server, path: str, body: dict[str, Any]) -> dict:
    """POST `body` while polling /health; returns the error body of the 400."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        fut = pool.submit(post, server, path, body)
        health = []
        while not fut.done():
            t = time.monotonic()
            r = httpx.get(server.base_url + "/health", timeout=10)
            health.append((r.status_code, time.monotonic() - t))
            time.sleep(0.2)
        resp = fut.result()
        took = time.monotonic() - started
    assert resp.status_code == 400, resp.text
    assert took < 15, took  # the probe's deadline, not vLLM's 60 s compile timeout
    assert all(code == 200 and lag < 2 for code, lag in health), health
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    return resp.json()["error"]


def chat(server: Server, **kw: Any) -> dict[str, Any]:
    return {"model": server.model, "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", {"structured_outputs": {"regex": PATHOLOGICAL}}),
        ("/v1/completions", {"guided_regex": PATHOLOGICAL}),
    ],
    ids=["chat-structured_outputs", "completions-guided_regex"],
)
def test_pathological_client_regex_is_refused(
    server: Server, path: str, field: dict[str, Any]
) -> None:
    body = chat(server, max_tokens=4, **field)
    if path == "/v1/completions":
        body = {"model": server.model, "prompt": "hi", "max_tokens": 4, **field}
    error = refused_quickly_with_health(server, path, body)
    assert error["code"] == "schema_too_complex"


@pytest.mark.timeout(60)
def test_pathological_response_format_schema_is_refused(server: Server) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep_defs()}}
    error = refused_quickly_with_health(
        server, "/v1/chat/completions", chat(server, response_format=rf, max_tokens=4)
    )
    assert error["code"] == "schema_too_complex"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 9, "maximum": 1}}},
        {"type": "string", "enum": []},
        {"type": "integer", "enum": ["a", "b"]},
    ],
    ids=["min>max", "empty-enum", "enum-type"],
)
def test_unsatisfiable_schema_is_invalid_schema(server: Server, schema: dict[str, Any]) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    resp = post(server, "/v1/chat/completions", chat(server, response_format=rf, max_tokens=4))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_schema"


@pytest.mark.timeout(90)  # a 2-token completion: seconds, unless the shared engine is busy
def test_grammar_is_refused_and_a_plain_regex_still_constrains(server: Server) -> None:
    resp = post(server, "/v1/completions", {
        "model": server.model, "prompt": "hi", "max_tokens": 4, "guided_grammar": "root ::= 'a'"
    })  # fmt: skip
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_constraint"
    body = {"model": server.model, "prompt": "Answer yes or no: is 2 > 1?", "max_tokens": 2,
            "temperature": 0, "structured_outputs": {"regex": "(yes|no)"}}  # fmt: skip
    resp = post(server, "/v1/completions", body, timeout=80)
    assert resp.status_code == 200, resp.text
    assert re.fullmatch("yes|no", resp.json()["choices"][0]["text"])
