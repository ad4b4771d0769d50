"""Chat completions' encoder: a `Turn` as a ``chat.completion`` or its SSE chunks.

A tool turn's typed events (`loopstack.serving.http.events`) become chunks the way OpenAI streams
them: the role first, then content deltas; a call's first chunk carries its id and name with empty
arguments, the argument text follows in deltas; the finish reason; the usage chunk when the client
asked for it (``stream_options.include_usage``); ``data: [DONE]``. A request passed through to the
engine (no tools, ``/v1/completions``) is answered with the engine's own objects as they came
(logprobs, ``n`` choices), re-encoded, never re-read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from loopstack.serving.exceptions import ServingError
from loopstack.serving.http.context_fit import Fit
from loopstack.serving.http.events import CallDelta, CallStart, Event, Finish, TextDelta, Usage
from loopstack.serving.http.service import Turn
from loopstack.serving.protocol import chat_chunk, chat_response, completion_id, tool_call_dict

__all__ = ["KEEPALIVE", "ChatEncoder"]

#: An SSE comment: every SSE client skips it (the openai SDK's decoder too).
KEEPALIVE = b": keepalive\n\n"
DONE = b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class ChatEncoder:
    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.id, self.model = completion_id(), model
        self.include_usage = include_usage
        self.started = False

    def bind(self, fit: Fit) -> None:
        pass

    def in_band(self, exc: ServingError) -> bool:
        return False

    def items(self, turn: Turn) -> AsyncIterator[Any]:
        if turn.generated is None and turn.passed is not None and not isinstance(turn.passed, dict):
            return turn.passed  # the engine's chunks, as they came
        return turn.events()

    def opening(self) -> list[bytes]:
        return []

    def _chunk(self, **kw: Any) -> bytes:
        return _sse(chat_chunk(id_=self.id, model=self.model, **kw))

    def encode(self, item: dict[str, Any] | Event) -> list[bytes]:
        if isinstance(item, dict):
            return [_sse(item)]
        out = []
        if not self.started:
            self.started = True
            out.append(self._chunk(delta={"role": "assistant", "content": ""}))
        if isinstance(item, TextDelta):
            out.append(self._chunk(delta={"content": item.text}))
        elif isinstance(item, CallStart):
            call = {"index": item.index, **tool_call_dict(item.id, item.name, "")}
            out.append(self._chunk(delta={"tool_calls": [call]}))
        elif isinstance(item, CallDelta):
            call = {"index": item.index, "function": {"arguments": item.arguments}}
            out.append(self._chunk(delta={"tool_calls": [call]}))
        elif isinstance(item, Finish):
            out.append(self._chunk(finish_reason=item.reason))
        elif isinstance(item, Usage) and self.include_usage:
            out.append(self._chunk(usage=item.chat()))
        return out

    def keepalive(self) -> bytes:
        return KEEPALIVE

    async def closing(self) -> list[bytes]:
        return [DONE]

    def failed(self, exc: ServingError) -> list[bytes]:
        return [_sse(exc.to_body()), DONE]

    async def whole(self, turn: Turn) -> dict[str, Any]:
        if isinstance(turn.passed, dict):
            return turn.passed
        done = await turn.completion()
        calls = [tool_call_dict(c.id, c.name, c.arguments) for c in done.calls]
        usage = done.usage or Usage(turn.prompt_tokens or 0, 0)
        return chat_response(
            id_=self.id,
            model=self.model,
            content=done.text.strip() or None if calls else done.text,
            tool_calls=calls,
            finish_reason=done.finish,
            usage=usage.chat(),
        )
