"""The chat path's answer as Anthropic Messages: a whole message, or the exact SSE events.

The chat path (`serving.chat.ChatService`) answers a dict or chat-completion SSE chunks;
`StreamTranslator` turns the chunks into the event sequence the anthropic SDK checks::

    message_start (content: [], usage)
    content_block_start -> content_block_delta* (text_delta | input_json_delta) ->
        content_block_stop                                      (per block)
    message_delta (stop_reason, stop_sequence, usage) -> message_stop

`relay` sends ``message_start`` at once and a ``ping`` after every `PING_INTERVAL_S` of
silence - a CPU prefills Claude Code's ~19k-token first prompt for minutes, and clients give
up on a silent connection. An error once the events have begun is an ``event: error`` with
the Anthropic envelope. The admission slot is held until the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from serving.exceptions import ServingError, UpstreamError
from serving.http.messages.protocol import message_id, stop_reason, usage
from serving.metrics import Metrics

logger = logging.getLogger(__name__)
__all__ = ["PING_INTERVAL_S", "StreamTranslator", "anthropic_error", "error_type", "relay"]

#: Seconds of silence (a long prefill, a grammar compiling) after which a ``ping`` is sent.
PING_INTERVAL_S = 5.0

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def sse_objects(buffer: bytearray, chunk: bytes) -> list[dict[str, Any] | str]:
    """The ``data:`` payloads complete in `buffer` + `chunk` (JSON objects, or ``[DONE]``);
    an incomplete tail stays in `buffer`."""
    buffer += chunk
    out: list[dict[str, Any] | str] = []
    while (end := buffer.find(b"\n\n")) >= 0:
        raw, buffer[:] = bytes(buffer[:end]), buffer[end + 2 :]
        for line in raw.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                out.append("[DONE]")
            elif payload:
                out.append(json.loads(payload))
    return out


class StreamTranslator:
    """Chat-completion chunks in, Anthropic events out (one translator per response)."""

    def __init__(self, *, model: str, input_tokens: int, stop_sequences: list[str] | None):
        self.model = model
        self.input_tokens = input_tokens
        self.stop_sequences = stop_sequences
        self.index = -1  # the open block's index
        self.open: str | None = None  # "text" | "tool_use"
        self.calls: dict[int, int] = {}  # chat tool-call index -> block index
        self.pending_space = ""  # whitespace before any text block: sent once text follows
        self.finish: str | None = None
        self.matched: Any = None
        self.usage: dict[str, Any] = {}
        self.done = False

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(self.input_tokens, 0, None),
        }
        return event("message_start", {"type": "message_start", "message": message})

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        data = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*out, event("content_block_start", data)]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        data = {"type": "content_block_delta", "index": self.index, "delta": delta}
        if index is not None:
            data["index"] = index
        return event("content_block_delta", data)

    def feed(self, obj: dict[str, Any]) -> list[bytes]:
        """Events for one chat chunk. Raises `UpstreamError` for an in-band error."""
        if "error" in obj:
            err = obj["error"] if isinstance(obj["error"], dict) else {}
            code = err.get("code")
            raise UpstreamError(code if isinstance(code, int) and 400 <= code < 600 else 502, obj)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        out: list[bytes] = []
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open != "text":
                    if not (self.pending_space + text).strip():
                        self.pending_space += text
                        continue
                    text, self.pending_space = self.pending_space + text, ""
                    out += self._open({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or []:
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        return out

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        fn = call.get("function") or {}
        chat_index = int(call.get("index", 0))
        if chat_index not in self.calls:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{message_id()[4:]}",
                "name": fn.get("name") or "",
                "input": {},
            }
            self.pending_space = ""
            out += self._open(block)
            self.calls[chat_index] = self.index
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            partial = {"type": "input_json_delta", "partial_json": args}
            out.append(self._delta(partial, self.calls[chat_index]))
        return out

    def finish_events(self) -> list[bytes]:
        finish = self.finish
        if self.calls and finish in (None, "stop"):
            finish = "tool_calls"
        reason, matched = stop_reason(finish, self.matched, self.stop_sequences)
        u = self.usage
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        final = usage(u.get("prompt_tokens", self.input_tokens), u.get("completion_tokens", 0),
                      cached)  # fmt: skip
        final.pop("cache_creation_input_tokens")
        delta = {"stop_reason": reason, "stop_sequence": matched}
        self.done = True
        return [
            *self._close(),
            event("message_delta", {"type": "message_delta", "delta": delta, "usage": final}),
            event("message_stop", {"type": "message_stop"}),
        ]


async def relay(
    translator: StreamTranslator,
    first: asyncio.Future[bytes | None],
    rest: AsyncIterator[bytes],
    slot: contextlib.AsyncExitStack,
    metrics: Metrics,
) -> AsyncIterator[bytes]:
    """The events of a stream whose first chunk `first` is awaited (or already there), the
    chunks of `rest` after it; pings in the silences; the slot released at the end."""
    buffer = bytearray()
    pending: asyncio.Future[bytes | None] | None = first
    try:
        yield translator.start()
        while pending is not None:
            done, _ = await asyncio.wait({pending}, timeout=PING_INTERVAL_S)
            if not done:
                yield event("ping", {"type": "ping"})
                continue
            chunk = pending.result()
            pending = None
            if chunk is None:
                break
            stop = False
            for obj in sse_objects(buffer, chunk):
                if obj == "[DONE]":
                    stop = True
                    break
                assert isinstance(obj, dict)
                for out in translator.feed(obj):
                    yield out
            if stop:
                break
            pending = asyncio.ensure_future(anext(rest, None))
        for out in translator.finish_events():
            yield out
    except ServingError as exc:  # the events have begun: report in-band, as Anthropic does
        translator.done = True
        logger.warning("messages stream failed: %s", exc.message)
        yield event("error", anthropic_error(exc.status_code, exc.message))
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        if not translator.done:
            metrics.aborted.inc()
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        await slot.aclose()
