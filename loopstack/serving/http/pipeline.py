"""The one request pipeline behind every generating wire API.

Chat completions, Responses and Messages differ in how a request is written and how its
answer is encoded; everything between is here, once, in one order:

1. **setup** (`prepare`): the limits (`check_chat`), the session key engine calls carry
   (`bind_session`), ``max_tokens`` lowered to what the context leaves (`fit_chat`) - before
   an admission slot is taken, so a refused request never holds one;
2. **admission**: one slot for the whole generation; a stream keeps it until it ends;
3. **the turn** (`ChatService.turn`): everything a 400 can come from runs before it returns;
4. **the stream starts** (the encoder's opening events) once the turn has: a tool turn at
   once (everything a 400 can come from has run), a request passed through to the engine at
   its first chunk (the engine's own 4xx come before it) or after `FIRST_EVENT_WAIT_S` without
   one. An error before that is an HTTP error in the API's own shape;
5. **keepalive**: after every `KEEPALIVE_S` of silence (a CPU prefills Claude Code's ~19k-token
   first prompt for minutes; clients give up on a silent connection) the encoder's own
   keepalive (chat: an SSE comment; Responses: ``response.in_progress``; Messages: ``ping``);
6. **closing**: the encoder's closing events; an error once the stream has begun is said
   in-band, in the API's own error event; a stream that did not finish counts an abort; the
   engine stream is closed (vLLM aborts) and the slot released.

A front-end is an `Encoder` of the typed events (`loopstack.serving.http.events`) and a router that
translates its request into a chat request and calls `serve`. An encoder may ask for a
refusal to be said in its stream rather than as an HTTP error (`Encoder.in_band`): Codex
compacts its history only when a ``response.failed`` event says ``context_length_exceeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from loopstack.serving.engine.transport import session_key_var
from loopstack.serving.exceptions import ServingError
from loopstack.serving.http.aliases import resolve_model_name
from loopstack.serving.http.context_fit import Fit, clamped, fit_chat
from loopstack.serving.http.limits import check_chat
from loopstack.serving.http.service import Turn, wire_headers
from loopstack.serving.http.state import AppState
from loopstack.serving.metrics import Metrics
from loopstack.serving.protocol import ChatCompletionRequest

__all__ = [
    "FIRST_EVENT_WAIT_S",
    "KEEPALIVE_S",
    "Encoder",
    "bind_session",
    "check_model",
    "generate",
    "prepare",
    "serve",
]

#: How long the first event is awaited before the stream starts: an error before it is an
#: HTTP error (its status, the API's error body), after it an in-band error event.
FIRST_EVENT_WAIT_S = 1.0
#: Seconds of silence (a long prefill, a grammar compiling) after which a keepalive is sent.
KEEPALIVE_S = 5.0

_END: Any = object()


class Encoder(Protocol):
    """One wire API's answer: the typed events of a `Turn` as its bytes, or its whole body."""

    def bind(self, fit: Fit) -> None:
        """What setup found (the prompt's token count) before anything is encoded."""

    def in_band(self, exc: ServingError) -> bool:
        """Whether a refusal before the stream starts is said in the stream (True) or as an
        HTTP error (False)."""

    def items(self, turn: Turn) -> AsyncIterator[Any]:
        """What `encode` takes, one by one: the turn's events (chat: or the engine's chunks
        of a request passed through, as they came)."""

    def opening(self) -> list[bytes]: ...
    def encode(self, item: Any) -> list[bytes]: ...
    def keepalive(self) -> bytes: ...
    async def closing(self) -> list[bytes]: ...
    def failed(self, exc: ServingError) -> list[bytes]: ...
    async def whole(self, turn: Turn) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- setup
def check_model(state: AppState, name: str) -> None:
    """The served model, an alias of it, or a 404 listing what is served."""
    resolve_model_name(name, state.model_name, state.model_aliases)


def bind_session(request: Request, user: Any = None) -> None:
    """The session key engine calls carry (`x-session-id` header, else the client's user)."""
    session_key_var.set(request.headers.get("x-session-id") or (str(user) if user else None))


async def prepare(
    state: AppState,
    request: Request,
    chat: ChatCompletionRequest,
    *,
    user: Any = None,
    count: bool = False,
) -> Fit:
    """Setup, the same for every API: limits, session, the completion limit fitted."""
    check_chat(chat, state.limits, state.max_model_len)
    bind_session(request, user)
    return await fit_chat(chat, state.chat, state.max_model_len, count=count)


async def serve(
    state: AppState,
    request: Request,
    encoder: Encoder,
    chat: ChatCompletionRequest,
    *,
    user: Any = None,
    count: bool = False,
    headers: dict[str, str] | None = None,
) -> Response:
    """A translated chat request through the whole pipeline, answered by `encoder`."""
    headers = dict(headers or {})
    try:
        fit = await prepare(state, request, chat, user=user, count=count)
    except ServingError as exc:
        if chat.stream and encoder.in_band(exc):
            return _stream(_refused(encoder, exc), headers)
        raise
    encoder.bind(fit)
    headers.update(clamped(fit.asked, fit.given))
    request_ = fit.request
    return await generate(
        state, encoder, lambda: state.chat.turn(request_), stream=bool(chat.stream), headers=headers
    )


async def generate(
    state: AppState,
    encoder: Encoder,
    make: Callable[[], Awaitable[Turn]],
    *,
    stream: bool,
    headers: dict[str, str] | None = None,
) -> Response:
    """Admission, the turn, and its answer: whole, or streamed with the slot kept."""
    headers = dict(headers or {})
    async with contextlib.AsyncExitStack() as slot:
        await slot.enter_async_context(state.admission.slot())
        try:
            turn = await make()
        except ServingError as exc:
            if stream and encoder.in_band(exc):
                return _stream(_refused(encoder, exc), headers)
            raise
        headers = {**turn.headers, **headers}
        if not stream:
            try:
                body = await encoder.whole(turn)
            finally:
                await turn.aclose()
            return JSONResponse(body, headers=wire_headers(headers) or None)
        items = encoder.items(turn)
        first: asyncio.Future[Any] = asyncio.ensure_future(anext(items, _END))
        try:
            if turn.generated is None:  # a tool turn has started: its errors are in-band
                await asyncio.wait({first}, timeout=FIRST_EVENT_WAIT_S)
            if turn.generated is None and first.done() and (error := first.exception()):
                if not (isinstance(error, ServingError) and encoder.in_band(error)):
                    raise error
        except BaseException:
            await _cancel(first)
            await _aclose(items)
            await turn.aclose()
            raise
        stream_ = _body(encoder, first, items, slot.pop_all(), state.metrics)
        return _stream(stream_, headers)
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- the stream
class _Stream(StreamingResponse):
    """A stream whose body is closed when the response ends, however it ends: a client that
    leaves is noticed by a failed send (ASGI 2.4) or a cancelled task group (older servers),
    and neither closes the body, which would otherwise hold its admission slot and keep the
    engine generating until the garbage collector came by."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def _stream(body: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
    return _Stream(
        body,
        media_type="text/event-stream",
        headers=wire_headers({**headers, "cache-control": "no-cache"}),
    )


async def _refused(encoder: Encoder, exc: ServingError) -> AsyncIterator[bytes]:
    for out in encoder.opening():
        yield out
    for out in encoder.failed(exc):
        yield out


async def _body(
    encoder: Encoder,
    first: asyncio.Future[Any],
    items: AsyncIterator[Any],
    slot: contextlib.AsyncExitStack,
    metrics: Metrics,
) -> AsyncIterator[bytes]:
    finished = False
    pending: asyncio.Future[Any] | None = first
    try:
        for out in encoder.opening():
            yield out
        while pending is not None:
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield encoder.keepalive()
                continue
            item, pending = pending.result(), None
            if item is _END:
                break
            pending = asyncio.ensure_future(anext(items, _END))
            for out in encoder.encode(item):
                yield out
        for out in await encoder.closing():
            yield out
        finished = True
    except ServingError as exc:  # the stream has begun: said in-band, in the API's own event
        finished = True
        for out in encoder.failed(exc):
            yield out
    finally:  # shielded: a cancelled task group re-cancels every await until this is done
        with anyio.CancelScope(shield=True):
            if pending is not None:
                await _cancel(pending)  # the engine stream closes: vLLM aborts the generation
            if not finished:
                metrics.aborted.inc()
            await _aclose(items)
            await slot.aclose()


async def _cancel(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.cancel()
    with contextlib.suppress(BaseException):
        await future


async def _aclose(items: AsyncIterator[Any]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
