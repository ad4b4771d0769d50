"""The app: `build_app` puts the serving objects on ``app.state``, includes the routes
(`loopstack.serving.http.chat.router`: a module-level router, one handler per endpoint, disconnects
cancel the generation) and wraps them in what every request goes through - auth and the body limit
(`loopstack.serving.http.limits.EdgeGuard`), trace ids with request metrics and access log
(`TraceMiddleware`), and the exception handlers that answer every error with the OpenAI error body
(`loopstack.serving.exceptions.error_body`)."""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopstack.serving.exceptions import ServingError, error_body
from loopstack.serving.http.chat.router import router
from loopstack.serving.http.limits import EdgeGuard
from loopstack.serving.http.messages.router import install as install_messages
from loopstack.serving.http.responses.router import router as responses_router
from loopstack.serving.http.state import AppState
from loopstack.serving.metrics import Metrics

__all__ = ["AppState", "TraceIdFilter", "TraceMiddleware", "build_app", "trace_id_var"]

logger = logging.getLogger(__name__)
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


# --------------------------------------------------------------------------- error answers
async def serving_error(_: Request, exc: ServingError) -> JSONResponse:
    """Our errors answer with their own status and body, and ``Retry-After`` if they have one."""
    retry = getattr(exc, "retry_after_s", None)  # Overloaded (429), EngineUnavailable (503)
    headers = {"Retry-After": str(retry)} if retry is not None else None
    if exc.status_code >= 500:
        logger.error("%s: %s", type(exc).__name__, exc.message)
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=headers)


async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that does not parse or validate: one 400 naming the first bad field as `param`
    and up to five problems in the message."""
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
    code = validation_code(str(first.get("type", "")))
    body = error_body(
        message, type_="invalid_request_error", code=code, param=".".join(loc) or None
    )
    return JSONResponse(body, status_code=400)


def validation_code(kind: str) -> str | None:
    """OpenAI's ``code`` for a pydantic error type: ``missing_required_parameter``,
    ``unknown_parameter``, ``invalid_type`` (a value of the wrong type), ``invalid_value``; a
    body that is no JSON: null."""
    if kind == "json_invalid":
        return None
    if kind == "missing":
        return "missing_required_parameter"
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind.endswith(("_type", "_parsing")) or kind in ("model_attributes_type", "is_instance_of"):
        return "invalid_type"
    return "invalid_value"


async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own answers (unknown route, wrong method) in the same error body
    (OpenAI's ``code`` for them is null)."""
    body = error_body(str(exc.detail), type_="invalid_request_error", code=None)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def unexpected(_: Request, exc: Exception) -> JSONResponse:
    """A bug: logged with its traceback, answered with a 500 that tells the client nothing."""
    logger.exception("unhandled error")
    return JSONResponse(
        error_body("internal error", type_="server_error", code=None), status_code=500
    )


_ErrorAnswer = Callable[[Request, Any], Coroutine[Any, Any, Response]]
ERROR_ANSWERS: dict[int | type[Exception], _ErrorAnswer] = {
    ServingError: serving_error,
    RequestValidationError: validation_error,
    StarletteHTTPException: http_error,
    Exception: unexpected,
}


def build_app(
    state: AppState, *, lifespan: Any = None, routers: Sequence[APIRouter] = ()
) -> FastAPI:
    """The app: `state` on ``app.state.loopstack``, the routes of
    `loopstack.serving.http.chat.router.router` and of `routers` (more wire APIs' front-ends), the
    middleware and the exception handlers."""
    app = FastAPI(
        title="loopstack", version="0.1.0", lifespan=lifespan, exception_handlers=ERROR_ANSWERS
    )
    app.state.loopstack = state
    for each in (router, responses_router, *routers):  # responses: POST/GET/DELETE
        app.include_router(each)
    # Pure ASGI middlewares: @app.middleware("http") would wrap `receive` and keep client
    # disconnects from the routes' `with_cancellation`, so aborts would never happen. The
    # last one added runs first: trace ids and metrics see every answer, the guard's 401/413
    # too.
    app.add_middleware(
        EdgeGuard, api_key=state.api_key, max_request_bytes=state.limits.max_request_bytes
    )
    app.add_middleware(TraceMiddleware, metrics=state.metrics)
    install_messages(app)  # /v1/messages (Anthropic): routes and their error envelope
    return app
