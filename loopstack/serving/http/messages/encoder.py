"""The Messages API's encoder: a `Turn`'s typed events as Anthropic's SSE events, or the
whole message.

The event sequence the anthropic SDK checks::

    message_start (content: [], usage)
    content_block_start -> content_block_delta* (text_delta | input_json_delta) ->
        content_block_stop                                      (per block)
    message_delta (stop_reason, stop_sequence, usage) -> message_stop

The pipeline (`loopstack.serving.http.pipeline`) sends ``message_start`` once the first event is in
(or a second has passed) and a ``ping`` in every silence - a CPU prefills Claude Code's ~19k-token
first prompt for minutes, and clients give up on a silent connection. An error once the events have
begun is an ``event: error`` with the Anthropic envelope.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from loopstack.serving.exceptions import ServingError
from loopstack.serving.http.context_fit import Fit
from loopstack.serving.http.events import CallDelta, CallStart, Event, Finish, TextDelta, Usage
from loopstack.serving.http.messages.protocol import message_id, stop_reason, tool_input, usage
from loopstack.serving.http.service import Turn

logger = logging.getLogger(__name__)
__all__ = ["MessagesEncoder", "anthropic_error", "error_type"]

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


class MessagesEncoder:
    """One message's events (stream) or the whole message."""

    def __init__(self, *, model: str, stop_sequences: list[str] | None):
        self.model = model
        self.input_tokens = 0
        self.stop_sequences = stop_sequences
        self.index = -1  # the open block's index
        self.open: str | None = None  # "text" | "tool_use"
        self.calls: dict[int, int] = {}  # chat tool-call index -> block index
        self.pending_space = ""  # whitespace before any text block: sent once text follows
        self.finish: str | None = None
        self.matched: Any = None
        self.usage: Usage | None = None

    # -- the pipeline's encoder -------------------------------------------------------------
    def bind(self, fit: Fit) -> None:
        self.input_tokens = fit.prompt_tokens or 0  # counted: ``message_start`` says it

    def in_band(self, exc: ServingError) -> bool:
        return False

    def items(self, turn: Turn) -> AsyncIterator[Event]:
        return turn.events()

    def opening(self) -> list[bytes]:
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
        return [event("message_start", {"type": "message_start", "message": message})]

    def keepalive(self) -> bytes:
        return event("ping", {"type": "ping"})

    def failed(self, exc: ServingError) -> list[bytes]:
        logger.warning("messages stream failed: %s", exc.message)
        return [event("error", anthropic_error(exc.status_code, exc.message))]

    def encode(self, item: Event) -> list[bytes]:
        if isinstance(item, TextDelta):
            return self._text(item.text)
        if isinstance(item, CallStart):
            return self._call_start(item)
        if isinstance(item, CallDelta):
            return self._call_delta(item)
        if isinstance(item, Finish):
            self.finish, self.matched = item.reason, item.matched
        elif isinstance(item, Usage):
            self.usage = item
        return []

    async def closing(self) -> list[bytes]:
        finish = self.finish
        if self.calls and finish in (None, "stop"):
            finish = "tool_calls"
        reason, matched = stop_reason(finish, self.matched, self.stop_sequences)
        u = self.usage or Usage(self.input_tokens, 0)
        final = usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        final.pop("cache_creation_input_tokens")
        delta = {"stop_reason": reason, "stop_sequence": matched}
        return [
            *self._close(),
            event("message_delta", {"type": "message_delta", "delta": delta, "usage": final}),
            event("message_stop", {"type": "message_stop"}),
        ]

    async def whole(self, turn: Turn) -> dict[str, Any]:
        done = await turn.completion()
        content: list[dict[str, Any]] = []
        if done.text.strip():
            content.append({"type": "text", "text": done.text.strip() if done.calls else done.text})
        for call in done.calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"toolu_{uuid.uuid4().hex[:24]}",
                    "name": call.name,
                    "input": tool_input(call.arguments),
                }
            )
        finish = done.finish
        if done.calls and finish == "stop":
            finish = "tool_calls"
        reason, matched = stop_reason(finish, done.matched, self.stop_sequences)
        u = done.usage or Usage(turn.prompt_tokens or 0, 0)
        return {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": matched,
            "usage": usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        }

    # -- blocks -----------------------------------------------------------------------------
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

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != "text":
            if not (self.pending_space + text).strip():
                self.pending_space += text
                return out
            text, self.pending_space = self.pending_space + text, ""
            out += self._open({"type": "text", "text": ""})
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def _call_start(self, call: CallStart) -> list[bytes]:
        if call.index in self.calls:
            return []
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call.id or f"toolu_{message_id()[4:]}",
            "name": call.name,
            "input": {},
        }
        self.pending_space = ""
        out = self._open(block)
        self.calls[call.index] = self.index
        return out

    def _call_delta(self, delta: CallDelta) -> list[bytes]:
        out = [] if delta.index in self.calls else self._call_start(CallStart(delta.index, "", ""))
        partial = {"type": "input_json_delta", "partial_json": delta.arguments}
        out.append(self._delta(partial, self.calls[delta.index]))
        return out
