"""The HTTP routes: one module-level router whose handlers read the service objects from
``request.app.state``, and the one decorator that cancels a generation whose client went away.

The shape is vLLM's OpenAI server: ``vllm/entrypoints/openai/api_server.py`` declares its
routes on a module-level ``router = APIRouter()`` and each handler fetches its serving object
from ``raw_request.app.state``; ``vllm/entrypoints/utils.py`` has ``with_cancellation``, which
runs the handler as a task and races it against ``listen_for_disconnect`` (the ASGI receive
channel's ``http.disconnect``), cancelling the handler when the client leaves first. Ours
differs in three details: the cancelled handler is awaited, so its admission slot and engine
request are gone before the 499 is returned; context variables the handler set (the session
key) stay visible to the streamed body that is read after it returns; an abort is counted.

`serving.http.app.build_app` makes the app: it stores an `AppState` on ``app.state.loopstack``,
includes `router`, and installs the middleware (auth, body limit, trace ids) and the
exception handlers that turn every error into an OpenAI error body (more front-ends: its
``routers``). What a request means lives in `serving.http.chat` / `serving.embeddings`; a
generating handler hands `_generate` a front-end's `Answer` (body, whole or streamed, and its
headers), run in an admission slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from serving.embeddings import MINILM_NAMES, EmbeddingService
from serving.engine.supervisor import Engine
from serving.engine.transport import ENGINE_RETRY_AFTER_S, session_key_var
from serving.exceptions import ModelNotFound, ServingError
from serving.http.admission import Admission
from serving.http.aliases import resolve_model_name
from serving.http.chat import Answer, ChatService, wire_headers
from serving.http.codex_catalogue import codex_model_info
from serving.http.context_fit import clamped, fit_chat, fit_completion
from serving.http.limits import Limits, check_chat, check_completion, check_embeddings
from serving.metrics import Metrics
from serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

logger = logging.getLogger(__name__)

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "ERROR_RESPONSES",
    "AppState",
    "app_state",
    "bind_session",
    "listen_for_disconnect",
    "router",
    "with_cancellation",
]

#: What a generation whose client went away answers (nginx's "client closed request"; nobody
#: reads it, but the access log and the request metrics show it).
CLIENT_CLOSED_REQUEST = 499

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": what, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for status, what in [
        (400, "Invalid request"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (429, "Overloaded; see Retry-After"),
    ]
}


@dataclass
class AppState:
    """What the handlers serve with; `serving.http.app.build_app` puts it on ``app.state``."""

    engine: Engine
    chat: ChatService
    embeddings: EmbeddingService
    metrics: Metrics
    admission: Admission
    model_name: str
    api_key: str | None = None
    max_model_len: int | None = None
    limits: Limits = field(default_factory=Limits)
    model_aliases: dict[str, str] = field(default_factory=dict)  # LOOPSTACK_MODEL_ALIASES
    anthropic_model_names: bool = True  # claude-* on /v1/messages (serving.http.aliases)


def app_state(request: Request) -> AppState:
    """The `AppState` of the app serving `request`."""
    return cast(AppState, request.app.state.loopstack)


router = APIRouter()


# --------------------------------------------------------------------------- cancellation
async def listen_for_disconnect(request: Request) -> None:
    """Returns once the client has gone (the ASGI ``http.disconnect`` message).

    Reads the receive channel, so only for handlers whose body is already read (FastAPI
    parses it into the request model before calling the handler)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_P = ParamSpec("_P")
_UNSET = object()


def with_cancellation(
    handler: Callable[_P, Coroutine[Any, Any, Response]],
) -> Callable[_P, Coroutine[Any, Any, Response]]:
    """Cancel the handler (and with it the engine request it awaits) when the client goes away.

    The handler runs in its own task, raced against `listen_for_disconnect`; whichever ends
    first decides. On a disconnect the handler's task is cancelled and awaited (its admission
    slot is released, its engine request closed, so vLLM aborts the generation), the abort is
    counted and the answer is a 499. Otherwise the handler's answer (or its error) is
    returned, with the context variables it set copied back here, so a streamed body - read
    after the handler returns - sees them as if the handler had run inline. Once a
    `StreamingResponse` is returned, watching the client is the response's job.

    The handler must take the `Request` as the keyword argument ``request`` (FastAPI passes
    every parameter by name)."""

    @functools.wraps(handler)  # FastAPI reads the handler's signature through __wrapped__
    async def cancellable(*args: _P.args, **kwargs: _P.kwargs) -> Response:
        request = kwargs.get("request")
        if not isinstance(request, Request):
            raise TypeError(f"{handler.__name__} takes no `request: Request` parameter")
        context = contextvars.copy_context()
        work = asyncio.create_task(handler(*args, **kwargs), name=handler.__name__, context=context)
        gone = asyncio.create_task(listen_for_disconnect(request), name="listen_for_disconnect")
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # we are cancelled ourselves (shutdown): take the handler along
            await _cancel(work, gone)
            raise
        if work in done:
            gone.cancel()  # not awaited: nothing may come between the answer and its sending
            for var, value in context.items():
                if var.get(_UNSET) is not value:
                    var.set(value)
            return work.result()
        await _cancel(work)  # its `finally` blocks run before the answer goes out
        if (error := gone.exception()) is not None:
            logger.warning("listening for a disconnect failed: %r", error)
        app_state(request).metrics.aborted.inc()
        logger.info("client disconnected: %s cancelled", handler.__name__)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    return cancellable


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel `tasks` and wait until they have ended, their `finally` blocks run."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.warning("%s ended with %r when cancelled", task.get_name(), error)


# --------------------------------------------------------------------------- routes
@router.get("/health")
async def health(request: Request) -> Response:
    ok = await app_state(request).engine.healthy()
    headers = None if ok else {"Retry-After": str(ENGINE_RETRY_AFTER_S)}
    return JSONResponse(
        {"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503,
        headers=headers,
    )  # fmt: skip


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    ours = state.metrics.render().decode()
    return PlainTextResponse(ours + await state.engine.metrics_text())


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = app_state(request)
    now = int(time.time())
    llm: dict[str, Any] = {"id": state.model_name, "object": "model", "created": now}
    llm.update(owned_by="loopstack", max_model_len=state.max_model_len)
    emb = {"id": state.embeddings.model_name, "object": "model", "created": now}
    emb["owned_by"] = "loopstack"
    # `models`: Codex's catalogue (`GET {base_url}/models`), beside `data` for the openai SDK
    return {"object": "list", "data": [llm, emb], "models": [codex_model_info(state)]}


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
@with_cancellation
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    state = app_state(request)
    _check_model(state, req.model)
    check_chat(req, state.limits, state.max_model_len)
    bind_session(request, req.model_extra)
    fit = await fit_chat(req, state.chat, state.max_model_len)  # max_tokens lowered to fit

    async def run() -> Answer:
        answer = await state.chat.create(fit.request)
        return Answer(answer.body, {**answer.headers, **clamped(fit.asked, fit.given)})

    return await _generate(state, run)


@router.post("/v1/completions", responses=ERROR_RESPONSES)
@with_cancellation
async def completions(req: CompletionRequest, request: Request) -> Response:
    state = app_state(request)
    _check_model(state, req.model)
    check_completion(req, state.limits, state.max_model_len)
    bind_session(request, req.model_extra)
    req, asked = fit_completion(req, state.chat.prompts, state.max_model_len)
    body = req.model_dump(exclude_none=True)
    body["model"] = state.engine.model_name

    async def run() -> Answer:  # client constraints: probed or 400; then relayed
        return Answer(await state.chat.completion(body), clamped(asked, req.max_tokens))

    return await _generate(state, run)


@router.post("/v1/embeddings", responses=ERROR_RESPONSES)
async def embeddings(req: EmbeddingRequest, request: Request) -> dict[str, Any]:
    state = app_state(request)
    if req.model != state.embeddings.model_name and not (
        req.model in MINILM_NAMES and state.embeddings.model_name in MINILM_NAMES
    ):
        raise ModelNotFound(req.model)
    texts = check_embeddings(req, state.limits)
    async with state.admission.slot():
        return await state.embeddings.create(req, texts)


# --------------------------------------------------------------------------- generation
def _check_model(state: AppState, name: str) -> None:
    resolve_model_name(name, state.model_name, state.model_aliases)  # or 404


def bind_session(request: Request, extra: dict[str, Any] | None) -> None:
    """The session key engine calls carry (`x-session-id` header, else the OpenAI `user`)."""
    user = (extra or {}).get("user")
    session_key_var.set(request.headers.get("x-session-id") or (str(user) if user else None))


async def _generate(state: AppState, make: Callable[[], Awaitable[Answer]]) -> Response:
    """Run a generation in an admission slot; a stream keeps the slot until it ends. The
    answer's headers go out with it."""
    async with contextlib.AsyncExitStack() as slot:
        await slot.enter_async_context(state.admission.slot())
        answer = await make()
        result, headers = answer.body, answer.headers
        if isinstance(result, dict):
            return JSONResponse(result, headers=wire_headers(headers) or None)
        first = await anext(result, None)  # surfaces upstream 4xx before headers go out
        return StreamingResponse(
            _stream_in_slot(first, result, slot.pop_all(), state.metrics),
            media_type="text/event-stream",
            headers=wire_headers(headers) or None,
        )


async def _stream_in_slot(
    first: bytes | None,
    rest: AsyncIterator[bytes],
    slot: contextlib.AsyncExitStack,
    metrics: Metrics,
) -> AsyncIterator[bytes]:
    finished = False
    try:
        if first is not None:
            yield first
        async for chunk in rest:
            yield chunk
        finished = True
    except ServingError as exc:  # headers are out: report in-band, as OpenAI does
        finished = True
        yield b"data: " + json.dumps(exc.to_body()).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            metrics.aborted.inc()
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()
        await slot.aclose()
