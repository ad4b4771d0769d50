"""The routes live on one module-level router and read their service objects from
``app.state``; `with_cancellation` cancels a generation whose client went away (and only
then), before the 499 goes out."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.types import Message

from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.app import build_app
from loopstack.serving.http.cancellation import CLIENT_CLOSED_REQUEST, with_cancellation
from loopstack.serving.http.chat.router import router
from loopstack.serving.http.messages.router import router as messages_router
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import chat_body, post_chat

ROUTES = {
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/v1/models", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/embeddings", "POST"),
}
CANCELLABLE = {"/v1/chat/completions", "/v1/completions"}  # the ones that generate
# The Responses API's own router (loopstack.serving.http.responses.router), included by build_app
RESPONSES_ROUTES = {
    ("/v1/responses", "POST"),
    ("/v1/responses/{response_id}", "GET"),
    ("/v1/responses/{response_id}", "DELETE"),
}


def _api_routes(routes: list[Any]) -> dict[tuple[str, str], APIRoute]:
    return {(r.path, method): r for r in routes if isinstance(r, APIRoute) for method in r.methods}


# --------------------------------------------------------------------------- the router
def test_every_route_is_on_the_module_level_router(harness: Harness) -> None:
    declared = _api_routes(router.routes)
    assert set(declared) == ROUTES
    messages = _api_routes(messages_router.routes)  # the Anthropic front-end's own router
    assert set(messages) == {("/v1/messages", "POST"), ("/v1/messages/count_tokens", "POST")}
    served = _api_routes(build_app(harness.state).routes)  # build_app adds none of its own
    assert set(served) == ROUTES | RESPONSES_ROUTES | set(messages)
    wrapped = {path for (path, _), r in declared.items() if hasattr(r.endpoint, "__wrapped__")}
    assert wrapped == CANCELLABLE
    assert hasattr(messages[("/v1/messages", "POST")].endpoint, "__wrapped__")
    generating = served[("/v1/responses", "POST")].endpoint
    assert hasattr(generating, "__wrapped__")  # with_cancellation too


async def test_each_app_serves_its_own_state(make_harness: Any) -> None:
    first, second = make_harness(), make_harness()
    second.state.model_name = "other-model"
    ids = [
        [m["id"] for m in (await h.client.get("/v1/models")).json()["data"]]
        for h in (first, second)
    ]
    assert ids == [[MODEL, "all-MiniLM-L6-v2"], ["other-model", "all-MiniLM-L6-v2"]]
    assert (await post_chat(second)).status_code == 404  # "test-model" is not served there
    assert (await post_chat(first)).status_code == 200


# --------------------------------------------------------------------------- the decorator
def _request(harness: Harness, receive: Any) -> Request:
    scope = {"type": "http", "app": harness.app, "method": "POST", "path": "/", "headers": []}
    return Request(scope, receive)


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_handler_is_cancelled_when_the_client_disconnects(harness: Harness) -> None:
    started, cleaned_up = asyncio.Event(), asyncio.Event()

    async def leave() -> Message:
        await started.wait()
        return {"type": "http.disconnect"}

    @with_cancellation
    async def handler(request: Request) -> Response:
        started.set()
        try:
            await asyncio.Event().wait()  # a generation that would run for minutes
        finally:
            for _ in range(3):  # cleanup that itself awaits (closing the engine stream)
                await asyncio.sleep(0)
            cleaned_up.set()
        return Response()

    response = await handler(request=_request(harness, leave))
    assert response.status_code == CLIENT_CLOSED_REQUEST
    assert cleaned_up.is_set()  # the handler was cancelled and had finished before the 499
    assert harness.metric("loopstack_requests_aborted_total") == 1


async def test_a_handler_that_finishes_is_not_cancelled(harness: Harness) -> None:
    @with_cancellation
    async def handler(request: Request) -> Response:
        await asyncio.sleep(0.01)
        return JSONResponse({"done": True})

    response = await asyncio.wait_for(handler(request=_request(harness, _never)), 5)
    assert response.status_code == 200 and json.loads(bytes(response.body)) == {"done": True}
    assert harness.metric("loopstack_requests_aborted_total") == 0
    await asyncio.sleep(0)  # the listener's cancellation lands
    assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left listening


async def test_a_handler_error_is_raised_not_turned_into_a_499(harness: Harness) -> None:
    @with_cancellation
    async def handler(request: Request) -> Response:
        raise InvalidRequest("no", param="x")

    with pytest.raises(InvalidRequest):
        await handler(request=_request(harness, _never))
    assert harness.metric("loopstack_requests_aborted_total") == 0


async def test_context_the_handler_sets_is_seen_after_it_returns(harness: Harness) -> None:
    """A streamed body is read after the handler returns; it must see the session key."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    @with_cancellation
    async def handler(request: Request) -> Response:
        var.set("set by the handler")
        return Response()

    await handler(request=_request(harness, _never))
    assert var.get() == "set by the handler"


async def test_the_handler_is_cancelled_with_its_caller(harness: Harness) -> None:
    """A server that cancels the request (shutdown) takes the generation along."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    @with_cancellation
    async def handler(request: Request) -> Response:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Response()

    outer = asyncio.create_task(handler(request=_request(harness, _never)))
    await asyncio.wait_for(started.wait(), 5)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert cancelled.is_set()
    assert harness.metric("loopstack_requests_aborted_total") == 0  # not a client disconnect


# --------------------------------------------------------------------------- through the app
class Gate(asyncio.Event):
    """The fake engine's gate: holds the engine request, records that it was cancelled."""

    cancelled = False

    async def wait(self) -> bool:  # type: ignore[override]
        try:
            return await super().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def _post_and_leave(
    h: Harness, path: str, body: dict[str, Any], *, leave_when: Callable[[], Awaitable[Any]]
) -> list[Message]:
    """POST over raw ASGI; the client hangs up once `leave_when` returns."""
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(body).encode()}
        await leave_when()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"loopstack.test")],
        "client": ("127.0.0.1", 50000),
        "server": ("loopstack.test", 80),
    }
    await asyncio.wait_for(h.app(scope, receive, send), 10)
    return sent


async def _until(condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds within 5 s (a gauge: nothing to await)."""
    for _ in range(500):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return False


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/v1/chat/completions", chat_body(), id="chat"),
        pytest.param("/v1/completions", {"model": MODEL, "prompt": "Once"}, id="completions"),
    ],
)
async def test_a_client_that_leaves_cancels_its_engine_request(
    harness: Harness, path: str, body: dict[str, Any], stream: bool
) -> None:
    h = harness
    h.engine.gate = gate = Gate()
    body = {**body, "stream": stream}
    sent = await _post_and_leave(h, path, body, leave_when=h.engine.entered.wait)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    assert start["status"] == CLIENT_CLOSED_REQUEST
    assert gate.cancelled  # the engine request was closed before the answer went out
    assert h.metric("loopstack_requests_aborted_total") == 1
    assert h.metric("loopstack_requests_running") == 0  # the admission slot is free again
    assert h.metric("loopstack_requests_total", route=path, status="499") == 1


async def test_a_queued_request_whose_client_left_gives_up_its_place(make_harness: Any) -> None:
    h = make_harness(max_running=1, max_waiting=1)
    h.engine.gate = asyncio.Event()
    running = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)

    async def queued() -> None:
        assert await _until(lambda: h.metric("loopstack_requests_waiting") == 1)

    sent = await _post_and_leave(h, "/v1/chat/completions", chat_body(), leave_when=queued)
    assert sent[0]["status"] == CLIENT_CLOSED_REQUEST
    assert h.metric("loopstack_requests_waiting") == 0  # its place in the queue is free
    waiting = asyncio.ensure_future(post_chat(h))  # so this one queues instead of a 429
    assert await _until(lambda: h.metric("loopstack_requests_waiting") == 1)
    h.engine.gate.set()
    assert [r.status_code for r in await asyncio.gather(running, waiting)] == [200, 200]
