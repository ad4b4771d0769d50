"""The HTTP router: thin. Auth, admission, error mapping and disconnect handling live here;
what a request means lives in `serving.chat` / `serving.embeddings`."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.admission import Admission
from serving.chat import RESPONSE_HEADERS, ChatService
from serving.embeddings import MINILM_NAMES, EmbeddingService
from serving.engine import ENGINE_RETRY_AFTER_S, Engine, session_key_var
from serving.exceptions import ModelNotFound, ServingError, error_body
from serving.limits import EdgeGuard, Limits, check_chat, check_completion, check_embeddings
from serving.metrics import Metrics
from serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

logger = logging.getLogger(__name__)
_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
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
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="-")


class TraceIdFilter(logging.Filter):
    """Adds ``record.trace_id`` (the current request's id) to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = trace_id_var.get()
        return True


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
UNMATCHED_ROUTE = "unmatched"


def request_id(headers: dict[bytes, bytes]) -> str:
    """The client's ``x-request-id`` when it is a plain token, else a new id (bytes outside
    ASCII or an overlong value are not echoed back into headers and logs)."""
    raw = headers.get(b"x-request-id", b"").decode("latin-1")
    return raw if _REQUEST_ID.fullmatch(raw) else uuid.uuid4().hex[:16]


def route_label(scope: Scope) -> str:
    """The matched route's template (bounded set), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE


class TraceMiddleware:
    """Gives each request a trace_id (from ``x-request-id`` or new), logs and measures it."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace_id = request_id(dict(scope.get("headers") or []))
        token = trace_id_var.set(trace_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", trace_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = route_label(scope)
            elapsed = time.perf_counter() - started
            self.metrics.requests.labels(route=route, status=str(status)).inc()
            self.metrics.request_seconds.labels(route=route).observe(elapsed)
            path = scope.get("path", "")[:200].encode("unicode_escape").decode()
            logger.info("%s %s -> %d in %.1f ms", scope.get("method"), path, status, elapsed * 1e3)
            trace_id_var.reset(token)


@dataclass
class AppState:
    engine: Engine
    chat: ChatService
    embeddings: EmbeddingService
    metrics: Metrics
    admission: Admission
    model_name: str
    api_key: str | None = None
    max_model_len: int | None = None
    limits: Limits = field(default_factory=Limits)


def build_app(state: AppState, *, lifespan: Any = None) -> FastAPI:
    app = FastAPI(title="loopstack", version="0.1.0", lifespan=lifespan)
    app.state.loopstack = state
    # Pure ASGI middlewares: @app.middleware("http") would wrap `receive` and hide client
    # disconnects from request.is_disconnected(), so aborts would never happen. The last one
    # added runs first: trace ids and metrics see every answer, the guard's 401/413 too.
    app.add_middleware(
        EdgeGuard, api_key=state.api_key, max_request_bytes=state.limits.max_request_bytes
    )
    app.add_middleware(TraceMiddleware, metrics=state.metrics)
    limits = state.limits

    def check_model(name: str) -> None:
        if name != state.model_name:
            raise ModelNotFound(name)

    @app.exception_handler(ServingError)
    async def serving_error(_: Request, exc: ServingError) -> JSONResponse:
        retry = getattr(exc, "retry_after_s", None)  # Overloaded (429), EngineUnavailable (503)
        headers = {"Retry-After": str(retry)} if retry is not None else None
        if exc.status_code >= 500:
            logger.error("%s: %s", type(exc).__name__, exc.message)
        return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = "We could not parse the JSON body of your request."
        else:
            message = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
                for e in errors[:5]
            )
        body = error_body(
            message, type_="invalid_request_error", code=400, param=".".join(loc) or None
        )
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(str(exc.detail), type_="invalid_request_error", code=exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return JSONResponse(
            error_body("internal error", type_="server_error", code=500), status_code=500
        )

    # -- routes -------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        ok = await state.engine.healthy()
        headers = None if ok else {"Retry-After": str(ENGINE_RETRY_AFTER_S)}
        return JSONResponse(
            {"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503,
            headers=headers,
        )  # fmt: skip

    @app.get("/metrics")
    async def metrics() -> Response:
        ours = state.metrics.render().decode()
        return PlainTextResponse(ours + await state.engine.metrics_text())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        llm: dict[str, Any] = {"id": state.model_name, "object": "model", "created": now}
        llm.update(owned_by="loopstack", max_model_len=state.max_model_len)
        emb = {"id": state.embeddings.model_name, "object": "model", "created": now}
        emb["owned_by"] = "loopstack"
        return {"object": "list", "data": [llm, emb]}

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        check_model(req.model)
        check_chat(req, limits, state.max_model_len)
        bind_session(request, req.model_extra)
        return await _generate(request, lambda: state.chat.create(req))

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(req: CompletionRequest, request: Request) -> Response:
        check_model(req.model)
        check_completion(req, limits, state.max_model_len)
        bind_session(request, req.model_extra)
        body = req.model_dump(exclude_none=True)
        body["model"] = state.engine.model_name

        async def run() -> dict[str, Any] | AsyncIterator[bytes]:
            send = await state.chat.admit_completion(body)  # client constraints: probed or 400
            if req.stream:
                return _relay(state.engine.stream("/v1/completions", send))
            return await state.engine.post("/v1/completions", send)

        return await _generate(request, run)

    @app.post("/v1/embeddings", responses=ERROR_RESPONSES)
    async def embeddings(req: EmbeddingRequest) -> dict[str, Any]:
        if req.model != state.embeddings.model_name and not (
            req.model in MINILM_NAMES and state.embeddings.model_name in MINILM_NAMES
        ):
            raise ModelNotFound(req.model)
        texts = check_embeddings(req, limits)
        async with state.admission.slot():
            return await state.embeddings.create(req, texts)

    async def _generate(
        request: Request, make: Callable[[], Awaitable[dict[str, Any] | AsyncIterator[bytes]]]
    ) -> Response:
        """Run a generation in an admission slot; abort it if the client goes away."""
        slot = state.admission.slot()
        await slot.__aenter__()
        released = False
        headers: dict[str, str] = {}  # filled by the handler (`serving.chat.RESPONSE_HEADERS`)
        token = RESPONSE_HEADERS.set(headers)
        try:
            task = asyncio.ensure_future(make())  # copies the context: the same dict
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if not done and await request.is_disconnected():
                    task.cancel()
                    state.metrics.aborted.inc()
                    return Response(status_code=499)
            result = task.result()
            if isinstance(result, dict):
                return JSONResponse(result, headers=headers or None)
            first = await anext(result, None)  # surfaces upstream 4xx before headers go out
            released = True
            return StreamingResponse(
                _stream_in_slot(first, result, slot),
                media_type="text/event-stream",
                headers=headers or None,
            )
        finally:
            RESPONSE_HEADERS.reset(token)
            if not released:
                await slot.__aexit__(None, None, None)

    async def _stream_in_slot(
        first: bytes | None, rest: AsyncIterator[bytes], slot: Any
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
                state.metrics.aborted.inc()
            aclose = getattr(rest, "aclose", None)
            if aclose is not None:
                await aclose()
            await slot.__aexit__(None, None, None)

    return app


def bind_session(request: Request, extra: dict[str, Any] | None) -> None:
    """The session key engine calls carry (`x-session-id` header, else the OpenAI `user`)."""
    user = (extra or {}).get("user")
    session_key_var.set(request.headers.get("x-session-id") or (str(user) if user else None))


async def _relay(lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for line in lines:
        yield line + b"\n\n"
