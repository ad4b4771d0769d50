"""A streamed chat answer (``chat.completion.chunk`` SSE bytes) as the Responses API's events.

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
   headers are out.

While the engine has not answered (a long prefill), ``response.in_progress`` is sent again
every `KEEPALIVE_S` seconds: Codex gives up after 300 s without an event (an SSE comment
would not count, its parser drops comments).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from serving.exceptions import ServingError
from serving.http.responses.translate import Translated, call_item, chat_usage, custom_input, status_of
from serving.http.responses.protocol import (
    ResponsesRequest,
    message_item,
    new_id,
    output_text,
    response_object,
)

logger = logging.getLogger(__name__)

KEEPALIVE_S = 10.0

OnDone = Callable[[dict[str, Any]], Awaitable[None]]


async def chat_chunks(raw: AsyncIterator[bytes]) -> AsyncGenerator[dict[str, Any]]:
    """The JSON objects of a chat SSE byte stream (ends at ``[DONE]``)."""
    buffer = b""
    async for piece in raw:
        buffer += piece
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                if data:
                    yield json.loads(data)
    for line in buffer.split(b"\n"):
        data = line[5:].strip() if line.startswith(b"data:") else b""
        if data and data != b"[DONE]":
            yield json.loads(data)


class ResponseEvents:
    """The event stream of one response; `run` drives it from the chat stream."""

    def __init__(
        self, req: ResponsesRequest, tr: Translated, *, id_: str, on_done: OnDone | None = None
    ) -> None:
        self.req, self.tr, self.id = req, tr, id_
        self.on_done = on_done
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.text: str | None = None  # the open message's text (None: no message open)
        self.msg_index = -1
        self.held = ""  # leading whitespace, sent once real text follows
        self.call_index = -1  # output index of the open call (-1: none)
        self.calls: dict[int, int] = {}  # chat call index -> output index
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    # -- SSE ------------------------------------------------------------------------------
    def event(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def snapshot(self, status: str, **kw: Any) -> dict[str, Any]:
        return response_object(
            self.req,
            id_=self.id,
            status=status,
            output=list(self.output),
            notes=self.tr.notes,
            **kw,
        )

    # -- the whole stream -------------------------------------------------------------------
    async def run(self, chat: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        yield self.event("response.created", response=self.snapshot("in_progress"))
        yield self.event("response.in_progress", response=self.snapshot("in_progress"))
        chunks = chat_chunks(chat)
        pending: asyncio.Task[dict[str, Any]] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
                if not done:
                    yield self.event("response.in_progress", response=self.snapshot("in_progress"))
                    continue
                task, pending = pending, None
                try:
                    chunk = task.result()
                except StopAsyncIteration:
                    break
                if isinstance(chunk.get("error"), dict):
                    for out in self.failed(chunk["error"]):
                        yield out
                    return
                for out in self.feed(chunk):
                    yield out
        except ServingError as exc:  # the headers are out: said in-band
            for out in self.failed(exc.to_body()["error"]):
                yield out
            return
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            with contextlib.suppress(Exception):
                await chunks.aclose()
        for out in self.close_all():
            yield out
        status, incomplete = status_of(self.finish)
        final = self.snapshot(status, usage_=chat_usage(self.usage), incomplete=incomplete)
        if self.on_done is not None:
            await self.on_done(final)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield self.event(kind, response=final)

    # -- one chat chunk -----------------------------------------------------------------
    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self.text_delta(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self.call_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

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

    def call_delta(self, call: dict[str, Any]) -> list[bytes]:
        out = self.close_text()
        index = int(call.get("index", 0))
        fn = call.get("function") or {}
        if index not in self.calls:
            out += self.close_call()
            self.call_index = len(self.output)
            self.calls[index] = self.call_index
            item = call_item(
                call.get("id") or new_id("call"),
                fn.get("name") or "",
                "",
                self.tr.custom,
                status="in_progress",
            )
            self.output.append(item)
            out.append(
                self.event(
                    "response.output_item.added", output_index=self.call_index, item=dict(item)
                )
            )
        at = self.calls[index]
        item = self.output[at]
        piece = fn.get("arguments") or ""
        if not piece:
            return out
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

    def failed(self, error: dict[str, Any]) -> list[bytes]:
        body = {
            "code": str(error.get("code") or error.get("type") or "server_error"),
            "message": str(error.get("message") or "generation failed"),
        }
        logger.warning("response %s failed mid-stream: %s", self.id, body["message"][:300])
        return [self.event("response.failed", response=self.snapshot("failed", error=body))]
