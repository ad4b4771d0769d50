"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages API as
a thin front-end over the one chat request.

A Messages body is translated (`serving.http.messages_protocol.to_chat`) into a
`serving.protocol.ChatCompletionRequest` and served by `serving.chat.ChatService` exactly as
``/v1/chat/completions`` serves it: the same model check (with ``LOOPSTACK_MODEL_ALIASES``),
limits (`serving.limits.check_chat`), ``max_tokens`` lowered to fit (`context_fit`),
admission slot, constraint backend and its guarantee, metrics and trace id. Its answer is
translated back (`serving.http.messages`).

Errors on these routes use Anthropic's envelope ``{"type": "error", "error": {"type",
"message"}}``: `AnthropicErrors`, an ASGI middleware, rewrites every error answer of a
``/v1/messages`` path (the auth guard's 401 and 413, body validation, our own errors, the
framework's 404/405, a 500) from the OpenAI body the rest of the app builds. Both of
Anthropic's auth headers are taken (``x-api-key`` and ``Authorization: Bearer``: the guard in
`serving.limits`), ``?beta=true`` and any ``anthropic-beta`` header are accepted.

`install` is the one line `serving.api.build_app` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.exceptions import InvalidRequest
from serving.http import messages as events
from serving.http.aliases import check_messages_model
from serving.http.chat import wire_headers
from serving.http.context_fit import clamped, fit_chat
from serving.http.limits import check_chat
from serving.http.messages_protocol import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    message_from_chat,
    to_chat,
)
from serving.http.routes import (
    AppState,
    app_state,
    bind_session,
    with_cancellation,
)
from serving.protocol import ChatCompletionRequest

logger = logging.getLogger(__name__)
__all__ = ["FIRST_CHUNK_WAIT_S", "NOTE_HEADER", "AnthropicErrors", "install", "router"]

router = APIRouter()
PREFIX = "/v1/messages"
NOTE_HEADER = "x-loopstack-note"
#: How long the first chunk is awaited before the response starts (an engine error before
#: it is then an HTTP error, not an in-band one); after it, `message_start` and pings go out.
FIRST_CHUNK_WAIT_S = 1.0


def install(app: FastAPI) -> None:
    """The Messages routes and their error envelope on `app` (call after the app's own
    middleware: the envelope then also covers the auth guard's answers)."""
    app.include_router(router)
    app.add_middleware(AnthropicErrors)


# --------------------------------------------------------------------------- errors
class AnthropicErrors:
    """Rewrites the JSON error answers of ``/v1/messages*`` into Anthropic's envelope."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is whole
                return
            if start is None:
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            status = int(start["status"])
            new = json.dumps(events.anthropic_error(status, _message_of(bytes(body)))).encode()
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"content-type")
            ]
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(new)).encode())]  # fmt: skip
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": new})

        await self.app(scope, receive, rewrite)


def _message_of(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:1000] or "error"
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return data["detail"]
    return str(data)[:1000]


# --------------------------------------------------------------------------- translation
def _translate(req: MessagesRequest, *, stream: bool) -> tuple[ChatCompletionRequest, list[str]]:
    try:
        body, notes = to_chat(req, stream=stream)
        return chat_request(body), notes
    except ValidationError as exc:
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        said = errors[0]["msg"] if errors else str(exc)
        raise InvalidRequest(f"{where}: {said}", param="messages") from exc
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="messages") from exc


async def _prepare(
    state: AppState, req: MessagesRequest, request: Request
) -> tuple[ChatCompletionRequest, list[str], int | None, int | None, int]:
    check_messages_model(state, req.model)  # aliases, claude-*, or a 404 listing the served
    chat, notes = _translate(req, stream=req.stream)
    check_chat(chat, state.limits, state.max_model_len)
    bind_session(request, chat.model_extra)
    fit = await fit_chat(chat, state.chat, state.max_model_len, count=True)
    return fit.request, notes, fit.asked, fit.given, fit.prompt_tokens or 0


# --------------------------------------------------------------------------- routes
@router.post(PREFIX)
@with_cancellation
async def messages(req: MessagesRequest, request: Request) -> Response:
    state = app_state(request)
    chat, notes, asked, given, prompt_tokens = await _prepare(state, req, request)
    headers: dict[str, str] = clamped(asked, given)
    if notes:
        headers[NOTE_HEADER] = "; ".join(notes)[:1000]
    if not chat.stream:
        async with state.admission.slot():
            answer = await state.chat.create(chat, server_defaults=False)
        result = answer.body
        assert isinstance(result, dict)
        message = message_from_chat(result, model=req.model, stop_sequences=req.stop_sequences)
        return JSONResponse(message, headers=wire_headers({**answer.headers, **headers}) or None)
    return await _stream(state, req, chat, prompt_tokens, headers)


async def _stream(
    state: AppState,
    req: MessagesRequest,
    chat: ChatCompletionRequest,
    prompt_tokens: int,
    headers: dict[str, str],
) -> Response:
    translator = events.StreamTranslator(
        model=req.model, input_tokens=prompt_tokens, stop_sequences=req.stop_sequences
    )
    async with contextlib.AsyncExitStack() as slot:
        await slot.enter_async_context(state.admission.slot())
        answer = await state.chat.create(chat, server_defaults=False)
        headers = {**answer.headers, **headers}
        result = answer.body
        if isinstance(result, dict):  # not expected for a stream: sent as one chunk
            chunk = {**result, "choices": [
                {**c, "delta": c.get("message") or {}} for c in result.get("choices") or []
            ]}  # fmt: skip
            result = _single(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        first: asyncio.Future[bytes | None] = asyncio.ensure_future(anext(result, None))
        try:
            await asyncio.wait({first}, timeout=FIRST_CHUNK_WAIT_S)
            if first.done() and first.exception() is not None:
                first.result()  # an engine error before any event: an HTTP error
        except BaseException:
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            aclose = getattr(result, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            raise
        body = events.relay(translator, first, result, slot.pop_all(), state.metrics)
        return StreamingResponse(
            body,
            media_type="text/event-stream",
            headers=wire_headers({**headers, "cache-control": "no-cache"}),
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def _single(chunk: bytes) -> Any:
    yield chunk


@router.post(PREFIX + "/count_tokens")
async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, int]:
    state = app_state(request)
    check_messages_model(state, req.model)
    chat, _ = _translate(req, stream=False)
    fit = await fit_chat(chat, state.chat, None, count=True)
    return {"input_tokens": fit.prompt_tokens or 0}
