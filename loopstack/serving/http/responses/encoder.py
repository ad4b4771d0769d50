"""The Responses API's encoder: a `Turn`'s typed events as Response events, or the whole
Response object.

The order every client we know relies on (the openai SDK's stream helper raises otherwise;
Codex takes calls only from ``output_item.done``):

1. ``response.created`` (the Response with ``output: []``), ``response.in_progress``;
2. per text item: ``output_item.added`` (a message, ``content: []``) ->
   ``content_part.added`` -> ``output_text.delta``\\* (each with ``logprobs: []``) ->
   ``output_text.done`` -> ``content_part.done`` -> ``output_item.done``;
3. per call: ``output_item.added`` -> ``function_call_arguments.delta``\\* ->
   ``function_call_arguments.done`` -> ``output_item.done`` (a custom tool's call: added,
   then done with its whole ``input``);
4. ``response.completed`` (``response.incomplete`` when ``max_output_tokens`` ran out) with
   the whole Response and its usage - or ``response.failed`` with the error once the
   stream has begun.

The pipeline (`loopstack.serving.http.pipeline`) sends ``response.in_progress`` again in a silence
(a long prefill: Codex gives up after 300 s without an event, and drops SSE comments). A prompt too
long for the context is said as ``response.failed`` with ``context_length_exceeded`` (`in_band`):
that event, not an HTTP 400, is what makes Codex compact its history. One response keeps one
``created_at`` in every event.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from loopstack.serving.exceptions import ServingError
from loopstack.serving.http.context_fit import Fit
from loopstack.serving.http.events import CallDelta, CallStart, Event, Finish, TextDelta, Usage
from loopstack.serving.http.responses.protocol import (
    ResponsesRequest,
    message_item,
    new_id,
    output_text,
    response_object,
    usage,
)
from loopstack.serving.http.responses.translate import (
    Translated,
    call_item,
    custom_input,
    status_of,
)
from loopstack.serving.http.service import Turn

logger = logging.getLogger(__name__)

__all__ = ["ResponsesEncoder"]

OnDone = Callable[[dict[str, Any]], Awaitable[None]]
#: The refusals said as ``response.failed`` rather than an HTTP error (`in_band`).
IN_BAND_CODES = frozenset({"context_length_exceeded"})


def usage_of(u: Usage | None) -> dict[str, Any]:
    u = u or Usage(0, 0)
    return usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


class ResponsesEncoder:
    """One response's events (stream) or object (whole)."""

    def __init__(
        self, req: ResponsesRequest, tr: Translated, *, id_: str, on_done: OnDone | None = None
    ) -> None:
        self.req, self.tr, self.id = req, tr, id_
        self.on_done = on_done
        self.created_at = req.created_at  # read once per request: every event says it
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.text: str | None = None  # the open message's text (None: no message open)
        self.msg_index = -1
        self.held = ""  # leading whitespace, sent once real text follows
        self.call_index = -1  # output index of the open call (-1: none)
        self.calls: dict[int, int] = {}  # chat call index -> output index
        self.finish: str | None = None
        self.usage: Usage | None = None

    # -- the pipeline's encoder -------------------------------------------------------------
    def bind(self, fit: Fit) -> None:
        pass

    def in_band(self, exc: ServingError) -> bool:
        return exc.code in IN_BAND_CODES

    def items(self, turn: Turn) -> AsyncIterator[Event]:
        return turn.events()

    def opening(self) -> list[bytes]:
        return [
            self.event("response.created", response=self.snapshot("in_progress")),
            self.event("response.in_progress", response=self.snapshot("in_progress")),
        ]

    def encode(self, item: Event) -> list[bytes]:
        if isinstance(item, TextDelta):
            return self.text_delta(item.text)
        if isinstance(item, CallStart):
            return self.call_start(item)
        if isinstance(item, CallDelta):
            return self.call_delta(item)
        if isinstance(item, Finish):
            self.finish = item.reason
        elif isinstance(item, Usage):
            self.usage = item
        return []

    def keepalive(self) -> bytes:
        return self.event("response.in_progress", response=self.snapshot("in_progress"))

    async def closing(self) -> list[bytes]:
        out = self.close_all()
        status, incomplete = status_of(self.finish)
        final = self.snapshot(status, usage_=usage_of(self.usage), incomplete=incomplete)
        if self.on_done is not None:
            await self.on_done(final)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self.event(kind, response=final)]

    async def whole(self, turn: Turn) -> dict[str, Any]:
        done = await turn.completion()
        output: list[dict[str, Any]] = []
        text = done.text.strip() if done.calls else done.text
        if text.strip():
            output.append(message_item(text, id_=new_id("msg")))
        for call in done.calls:
            output.append(
                call_item(call.id or new_id("call"), call.name, call.arguments, self.tr.custom)
            )
        status, incomplete = status_of(done.finish)
        response = self.snapshot(
            status, output=output, usage_=usage_of(done.usage), incomplete=incomplete
        )
        if self.on_done is not None:
            await self.on_done(response)
        return response

    # -- SSE ------------------------------------------------------------------------------
    def event(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def snapshot(
        self, status: str, *, output: list[dict[str, Any]] | None = None, **kw: Any
    ) -> dict[str, Any]:
        return response_object(
            self.req,
            id_=self.id,
            created_at=self.created_at,
            status=status,
            output=list(self.output if output is None else output),
            notes=self.tr.notes,
            **kw,
        )

    # -- one event -------------------------------------------------------------------------
    def text_delta(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.call_index >= 0 or self.calls:
            return out  # text after a call is the envelope's, never the answer's
        if self.text is None:
            if not (self.held + text).strip():
                self.held += text
                return out
            text, self.held = self.held + text, ""
            self.msg_index, self.text = len(self.output), ""
            item = message_item("", id_=new_id("msg"), status="in_progress")
            item["content"] = []
            self.output.append(item)
            out.append(
                self.event("response.output_item.added", output_index=self.msg_index, item=item)
            )
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.msg_index,
                    content_index=0,
                    part=output_text(""),
                )
            )
        self.text += text
        item_id = self.output[self.msg_index]["id"]
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=self.msg_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        text, self.text = self.text, None
        item = message_item(text, id_=self.output[self.msg_index]["id"])
        self.output[self.msg_index] = item
        at = {"item_id": item["id"], "output_index": self.msg_index, "content_index": 0}
        return [
            self.event("response.output_text.done", **at, text=text, logprobs=[]),
            self.event("response.content_part.done", **at, part=output_text(text)),
            self.event("response.output_item.done", output_index=self.msg_index, item=item),
        ]

    def call_start(self, call: CallStart) -> list[bytes]:
        out = self.close_text()
        if call.index in self.calls:
            return out
        out += self.close_call()
        self.call_index = len(self.output)
        self.calls[call.index] = self.call_index
        item = call_item(
            call.id or new_id("call"), call.name, "", self.tr.custom, status="in_progress"
        )
        self.output.append(item)
        out.append(
            self.event("response.output_item.added", output_index=self.call_index, item=dict(item))
        )
        return out

    def call_delta(self, delta: CallDelta) -> list[bytes]:
        out: list[bytes] = []
        if delta.index not in self.calls:  # arguments before a start: the start is implied
            out += self.call_start(CallStart(delta.index, "", ""))
        at = self.calls[delta.index]
        item = self.output[at]
        piece = delta.arguments
        if item["type"] == "custom_tool_call":
            item["input"] += piece  # the chat arguments, decoded when the call is done
        else:
            item["arguments"] += piece
            if at == self.call_index:
                out.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=at,
                        delta=piece,
                    )
                )
        return out

    def close_call(self) -> list[bytes]:
        if self.call_index < 0:
            return []
        at, self.call_index = self.call_index, -1
        item = self.output[at]
        item["status"] = "completed"
        out = []
        if item["type"] == "custom_tool_call":
            item["input"] = custom_input(item["input"])
        else:
            out.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at,
                    arguments=item["arguments"],
                )
            )
        out.append(self.event("response.output_item.done", output_index=at, item=item))
        return out

    def close_all(self) -> list[bytes]:
        return self.close_text() + self.close_call()

    def failed(self, exc: ServingError) -> list[bytes]:
        error = exc.to_body()["error"]
        code = exc.code if isinstance(exc.code, str) else error.get("type") or "server_error"
        body = {"code": str(code), "message": exc.message or "generation failed"}
        logger.warning("response %s failed: %s", self.id, body["message"][:300])
        return [self.event("response.failed", response=self.snapshot("failed", error=body))]
