"""Client-supplied constraints on the real server, through the configured constraint backend:
a pathological regex or schema is answered quickly - refused with a 400 before vLLM sees it
where the backend builds automata (outlines), served where it matches lazily (llguidance,
the default) - /health stays fine meanwhile, an unsatisfiable schema is ``invalid_schema``,
and an ordinary client regex still constrains the real model."""

from __future__ import annotations

import concurrent.futures
import os
import re
import time
from typing import Any

import httpx
import pytest

from loopstack.serving.config import DEFAULT_BACKEND
from tests.integration.conftest import API_KEY, Server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# 2^20 DFA states: held vLLM's outlines compile thread for 60 s; llguidance: microseconds
PATHOLOGICAL = "(a|b)*a(a|b){19}"
# The server's backend: outlines builds automata and refuses these (400), llguidance (the
# default) and xgrammar match lazily and serve them (200).
BACKEND = os.environ.get("LOOPSTACK_CONSTRAINT_BACKEND", DEFAULT_BACKEND)


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


def answered_quickly_with_health(server: Server, path: str, body: dict[str, Any]) -> None:
    """POST `body` while polling /health: a quick answer, /health fine throughout: refused
    with a 400 ``schema_too_complex`` under outlines, served (200) under llguidance and
    xgrammar."""
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
    assert took < 15, took  # the probe's deadline, not vLLM's 60 s compile timeout
    assert all(code == 200 and lag < 2 for code, lag in health), health
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    if BACKEND == "outlines":
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "schema_too_complex"
    else:
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"], resp.text


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
def test_pathological_client_regex_is_answered_quickly(
    server: Server, path: str, field: dict[str, Any]
) -> None:
    body = chat(server, max_tokens=4, **field)
    if path == "/v1/completions":
        body = {"model": server.model, "prompt": "hi", "max_tokens": 4, **field}
    answered_quickly_with_health(server, path, body)


@pytest.mark.timeout(60)
def test_pathological_response_format_schema_is_answered_quickly(server: Server) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep_defs()}}
    answered_quickly_with_health(
        server, "/v1/chat/completions", chat(server, response_format=rf, max_tokens=4)
    )


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
