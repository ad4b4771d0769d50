"""Bad input gets an OpenAI-style error with the right 4xx - never a 500 or a hang."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def post(server: Server, body: Any, path: str = "/v1/chat/completions") -> httpx.Response:
    if isinstance(body, bytes):
        headers = {**AUTH, "content-type": "application/json"}
        return httpx.post(server.base_url + path, headers=headers, content=body, timeout=60)
    return httpx.post(server.base_url + path, headers=AUTH, json=body, timeout=60)


def assert_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    return dict(err)


def test_malformed_json(server: Server) -> None:
    r = post(server, b'{"model": "x", "messages": [')
    assert_error(r, 400)


def test_unknown_model_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert exc.value.status_code == 404


def test_unknown_embedding_model_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


@pytest.mark.parametrize(
    "patch",
    [
        {"temperature": 5},
        {"top_p": 0},
        {"max_tokens": 0},
        {"n": 0},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"tool_choice": "sometimes", "tools": [TOOL]},
        {"response_format": {"type": "json_schema"}},
    ],
    ids=["temperature", "top_p", "max_tokens", "n", "no-messages", "role", "tool-no-id",
         "tool-choice-word", "rf-no-schema"],
)  # fmt: skip
def test_bad_parameters(server: Server, patch: dict[str, Any]) -> None:
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], **patch}
    assert_error(post(server, body), 400)


def test_invalid_tool_schema(server: Server) -> None:
    bad = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": 3}},
    }
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "tools": [bad]}
    err = assert_error(post(server, body), 400)
    assert "tools[0]" in err["message"]


def test_bad_tool_name(server: Server) -> None:
    tool = {"type": "function", "function": {"name": "has space", "parameters": {}}}
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    assert_error(post(server, body), 400)


def test_tool_choice_unknown_tool(client: OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "hi"}],
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "not_there"}},
        )
    assert "not_there" in str(exc.value)


@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "tools"])
def test_context_too_long(client: OpenAI, server: Server, with_tools: bool) -> None:
    served = httpx.get(server.base_url + "/v1/models", headers=AUTH).json()["data"][0]
    huge = "word " * (int(served["max_model_len"]) + 2000)  # over the served context (32k on CPU)
    kw: dict[str, Any] = {"tools": [TOOL], "tool_choice": "required"} if with_tools else {}
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": huge}], max_tokens=8, **kw
        )
    assert exc.value.status_code == 400


def test_unknown_route_is_openai_style_404(server: Server) -> None:
    assert_error(httpx.get(server.base_url + "/v1/nothing-here", headers=AUTH), 404)


def test_embeddings_bad_input(server: Server) -> None:
    assert_error(post(server, {"model": "all-MiniLM-L6-v2", "input": []}, "/v1/embeddings"), 400)
    r = post(server, {"model": "all-MiniLM-L6-v2", "input": [""]}, "/v1/embeddings")
    assert_error(r, 400)
