"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages API as
a thin front-end over the one chat request.

A Messages body is translated (`loopstack.serving.http.messages.protocol.to_chat`) into a
`loopstack.serving.protocol.ChatCompletionRequest` and goes through the one pipeline
(`loopstack.serving.http.pipeline.serve`) exactly as ``/v1/chat/completions`` does: the same model
check (with ``LOOPSTACK_MODEL_ALIASES``), limits, ``max_tokens`` lowered to fit, admission slot,
`ChatService.turn` (selection defaults, constraint backend and its guarantee), keepalive, metrics
and trace id. The encoder (`loopstack.serving.http.messages.encoder`) writes the message.

Errors on these routes use Anthropic's envelope ``{"type": "error", "error": {"type",
"message"}}``: `AnthropicErrors`, an ASGI middleware, rewrites every error answer of a
``/v1/messages`` path (the auth guard's 401 and 413, body validation, our own errors, the
framework's 404/405, a 500) from the OpenAI body the rest of the app builds. Both of
Anthropic's auth headers are taken (``x-api-key`` and ``Authorization: Bearer``: the guard in
`loopstack.serving.http.limits`), ``?beta=true`` and any ``anthropic-beta`` header are accepted.

`install` is the one line `loopstack.serving.http.app.build_app` calls.
"""

from __future__ import annotations

import json
import logging

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.aliases import check_messages_model
from loopstack.serving.http.cancellation import with_cancellation
from loopstack.serving.http.context_fit import fit_chat
from loopstack.serving.http.messages import encoder as events
from loopstack.serving.http.messages.protocol import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    to_chat,
)
from loopstack.serving.http.pipeline import serve
from loopstack.serving.http.state import app_state
from loopstack.serving.protocol import ChatCompletionRequest

logger = logging.getLogger(__name__)
__all__ = ["NOTE_HEADER", "AnthropicErrors", "install", "router"]

router = APIRouter()
PREFIX = "/v1/messages"
NOTE_HEADER = "x-loopstack-note"


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


# --------------------------------------------------------------------------- routes
@router.post(PREFIX)
@with_cancellation
async def messages(req: MessagesRequest, request: Request) -> Response:
    state = app_state(request)
    check_messages_model(state, req.model)  # aliases, claude-*, or a 404 listing the served
    chat, notes = _translate(req, stream=req.stream)
    encoder = events.MessagesEncoder(model=req.model, stop_sequences=req.stop_sequences)
    headers = {NOTE_HEADER: "; ".join(notes)[:1000]} if notes else {}
    user = (chat.model_extra or {}).get("user")
    return await serve(state, request, encoder, chat, user=user, count=True, headers=headers)


@router.post(PREFIX + "/count_tokens")
async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, int]:
    state = app_state(request)
    check_messages_model(state, req.model)
    chat, _ = _translate(req, stream=False)
    fit = await fit_chat(chat, state.chat, None, count=True)
    return {"input_tokens": fit.prompt_tokens or 0}
