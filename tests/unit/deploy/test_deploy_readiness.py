"""Ready means "can serve" (issue: "Deploy that survives a real cluster", defect 4). Behind
vLLM production-stack's router our layer talks to the router, whose `/health` answers 200
with zero engines; it then answers a generation with 404 "model not found" (later 503).
While no engine serves our model, `/health` is 503 (the pod leaves the Service) and every
request gets 503 with Retry-After, never the router's 404/502. The real `VLLMEngine` and
API run; the router is an httpx MockTransport."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from loopstack.serving.engine.supervisor import VLLMEngine
from loopstack.serving.http.app import build_app
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import chat_body

MODEL = "engine"


class FakeRouter:
    """production-stack's router: healthy on its own; /v1/models lists what its ready
    engines serve; a request for a model no engine serves gets `no_engine_status`."""

    def __init__(self) -> None:
        self.engines: list[str] = []
        self.no_engine_status = 404
        self.upstream_status = 200  # what a present engine answers
        self.stall_s = 0.0  # how long /health and /v1/models take to answer
        self.timeouts: list[dict[str, float]] = []  # the client's limits, per health call

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/health", "/v1/models"):
            self.timeouts.append(request.extensions.get("timeout", {}))
            await asyncio.sleep(self.stall_s)
        if path == "/health":
            return httpx.Response(200, json={"status": "healthy"})
        if path == "/metrics":
            return httpx.Response(200, text="")
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": m, "object": "model"} for m in self.engines]})  # fmt: skip
        body = json.loads(request.content)
        if body.get("model") not in self.engines:
            if self.no_engine_status == 404:
                msg = f"Model {body.get('model')} not found or vLLM engine is sleeping."
                return httpx.Response(404, json={"error": msg})
            return httpx.Response(self.no_engine_status, json={"error": "no backend"})
        if self.upstream_status != 200:
            return httpx.Response(self.upstream_status, json={"error": {"message": "bad"}})
        return httpx.Response(200, json={
            "id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip


@pytest.fixture
async def wired() -> AsyncIterator[tuple[httpx.AsyncClient, FakeRouter]]:
    h = Harness()
    router = FakeRouter()
    engine = VLLMEngine([], env={}, port=0, model_name=MODEL, base_url="http://router.test")
    await engine._client.aclose()
    engine._client = engine.transport.client = httpx.AsyncClient(
        transport=httpx.MockTransport(router), base_url="http://router.test"
    )
    await engine.start()  # the router answers /health: the layer starts and listens
    h.state.engine = engine
    h.chat.engine = engine
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(h.state)), base_url="http://loopstack.test"
    )
    yield client, router
    await client.aclose()
    await h.client.aclose()
    await engine._client.aclose()


async def test_health_is_unready_until_an_engine_serves_our_model(
    wired: tuple[httpx.AsyncClient, FakeRouter],
) -> None:
    client, router = wired
    r = await client.get("/health")
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    router.engines = ["some-other-model"]
    assert (await client.get("/health")).status_code == 503
    router.engines = [MODEL]
    assert (await client.get("/health")).status_code == 200


@pytest.mark.parametrize("status", [404, 500, 503, 502])
@pytest.mark.parametrize("stream", [False, True])
async def test_requests_get_503_with_retry_after_while_no_engine_is_ready(
    wired: tuple[httpx.AsyncClient, FakeRouter], status: int, stream: bool
) -> None:
    client, router = wired
    router.no_engine_status = status
    r = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["error"]["code"] == "engine_unavailable"


async def test_with_an_engine_requests_pass_and_its_own_errors_are_kept(
    wired: tuple[httpx.AsyncClient, FakeRouter],
) -> None:
    client, router = wired
    router.engines = [MODEL]
    r = await client.post("/v1/chat/completions", json=chat_body())
    assert r.status_code == 200, r.text
    router.upstream_status = 400  # the engine's own 4xx is still the client's
    r = await client.post("/v1/chat/completions", json=chat_body())
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_500_after_the_routers_failover_is_503_with_retry_after(
    wired: tuple[httpx.AsyncClient, FakeRouter], stream: bool
) -> None:
    """Issue 35, defect 8: production-stack's router answers 500 once its failover over the
    replicas is exhausted (the replica it picked died mid-request): retry later, not 500."""
    client, router = wired
    router.engines = [MODEL]
    router.upstream_status = 500
    r = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["error"]["code"] == "engine_unavailable"


def health_worst_case_s() -> float:
    """How long one `/health` of the layer can take, read from the code: the deadline the
    engine's health check runs under (what `loopstack.serving.server` constructs it with)."""
    import inspect

    from loopstack.serving import server

    assert "health_timeout_s" not in inspect.getsource(server.create_app)  # the default
    default = inspect.signature(VLLMEngine).parameters["health_timeout_s"].default
    return float(default)


async def test_the_health_checks_calls_fit_in_its_deadline(
    wired: tuple[httpx.AsyncClient, FakeRouter],
) -> None:
    client, router = wired
    router.engines = [MODEL]
    router.timeouts.clear()  # the start's own calls
    assert (await client.get("/health")).status_code == 200
    calls = router.timeouts
    assert len(calls) == 2  # /health, then /v1/models (behind a router)
    # each call's own limits (pool, connect, write, read), one after the other
    assert sum(max(t.values()) for t in calls) <= health_worst_case_s()


async def test_a_stalled_engine_makes_health_unready_within_the_deadline() -> None:
    router = FakeRouter()
    router.engines = [MODEL]
    engine = VLLMEngine(
        [], env={}, port=0, model_name=MODEL, base_url="http://router.test", health_timeout_s=0.3
    )
    await engine._client.aclose()
    engine._client = engine.transport.client = httpx.AsyncClient(
        transport=httpx.MockTransport(router), base_url="http://router.test"
    )
    await engine.start()
    assert await engine.healthy()
    router.stall_s = 30.0
    t0 = time.monotonic()
    assert await engine.healthy() is False
    assert time.monotonic() - t0 < 2.0
    await engine._client.aclose()
