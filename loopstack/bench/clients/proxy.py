"""The measuring proxy: every request of a client passes through it, unchanged, to the
endpoint under test; on the way back it reads each answer (streamed or whole) for the time
of its first output and the tool calls in it.

One reader for the three APIs, so every client is measured the same way:

- the first output is the first event that carries something the model wrote: a text,
  reasoning or arguments delta (Responses ``response.*.delta``, Messages
  ``content_block_delta``, a chat chunk's ``delta.content`` or ``delta.tool_calls``), or a
  whole tool call (``response.output_item.done``, ``content_block_start`` of a ``tool_use``);
  for a whole (non-streamed) answer, the time the body was complete;
- a tool call is a Responses ``function_call``/``custom_tool_call``/``local_shell_call``
  item, a Messages ``tool_use`` block, a chat ``tool_calls`` entry.

The proxy runs in a thread of the bench's process (uvicorn), so the bench can run the
clients as blocking subprocesses meanwhile."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from loopstack.bench.clients import ClientBenchError

MODEL_PATHS = ("/chat/completions", "/responses", "/messages")
CALL_ITEMS = {"function_call", "custom_tool_call", "local_shell_call"}
_HOP = {b"host", b"content-length", b"connection", b"accept-encoding", b"transfer-encoding"}
_HOP_BACK = {"content-length", "connection", "transfer-encoding", "content-encoding"}
UPSTREAM_TIMEOUT_S = 1800.0  # Claude Code's first prompt takes minutes to prefill on a CPU


def is_model_request(method: str, path: str) -> bool:
    return method == "POST" and path.rstrip("/").endswith(MODEL_PATHS)


def event_output(event: dict[str, Any]) -> tuple[bool, int, str | None]:
    """What one streamed event carries: (model output?, tool calls in it, error text)."""
    kind = str(event.get("type", ""))
    if "choices" in event:  # a chat completion chunk
        calls, output = 0, False
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                output = True
            for call in delta.get("tool_calls") or []:
                output = True
                calls += 1 if call.get("id") else 0
        return output, calls, None
    if kind in ("error", "response.failed"):
        err = event.get("error") or (event.get("response") or {}).get("error") or event
        return False, 0, json.dumps(err)[:500]
    if kind.startswith("response.") and kind.endswith(".delta"):
        return True, 0, None
    if kind == "response.output_item.done":
        is_call = (event.get("item") or {}).get("type") in CALL_ITEMS
        return is_call, int(is_call), None
    if kind == "content_block_delta":
        return True, 0, None
    if kind == "content_block_start":
        is_call = (event.get("content_block") or {}).get("type") == "tool_use"
        return is_call, int(is_call), None
    return False, 0, None


def body_calls(body: Any) -> int:
    """Tool calls in a whole (non-streamed) answer of any of the three APIs."""
    if not isinstance(body, dict):
        return 0
    if isinstance(body.get("choices"), list):
        return sum(len((c.get("message") or {}).get("tool_calls") or []) for c in body["choices"])
    if isinstance(body.get("output"), list):  # Responses
        return sum(1 for i in body["output"] if i.get("type") in CALL_ITEMS)
    if isinstance(body.get("content"), list):  # Messages
        return sum(1 for b in body["content"] if b.get("type") == "tool_use")
    return 0


@dataclass
class Exchange:
    """One request through the proxy. Times are seconds since the request arrived."""

    method: str
    path: str
    started: float  # time.monotonic() when it arrived
    model_request: bool
    status: int = 0
    streamed: bool = False
    first_output_s: float | None = None
    total_s: float | None = None
    tool_calls: int = 0
    error: str | None = None
    notes: dict[str, str] = field(default_factory=dict)  # the server's x-loopstack-* headers
    request_body: bytes = b""
    _buffer: bytes = field(default=b"", repr=False)

    def feed(self, chunk: bytes, now: float) -> None:
        """A piece of a streamed answer: whole SSE ``data:`` lines are read as they come."""
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line.strip(), now)

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        output, calls, error = event_output(event)
        if output and self.first_output_s is None:
            self.first_output_s = now - self.started
        self.tool_calls += calls
        if error and self.error is None:
            self.error = error

    def finish_whole(self, body: bytes, now: float) -> None:
        """A whole answer: its calls; its first output is the time it was complete."""
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if self.status >= 400:
            self.error = body[:500].decode(errors="replace")
        elif self.model_request:
            self.tool_calls = body_calls(parsed)
            self.first_output_s = now - self.started

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status,
            "streamed": self.streamed,
            "first_output_s": _round(self.first_output_s),
            "total_s": _round(self.total_s),
            "tool_calls": self.tool_calls,
            "error": self.error,
            "notes": self.notes,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class MeasuringProxy:
    """Forwards everything to ``upstream`` (a server's root, no ``/v1``) and keeps an
    ``Exchange`` per request, in arrival order."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    def since(self, index: int) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges[index:])

    def mark(self) -> int:
        with self._lock:
            return len(self.exchanges)

    def app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=UPSTREAM_TIMEOUT_S)

        async def forward(request: Request) -> Response:
            body = await request.body()
            path = request.url.path
            ex = Exchange(
                method=request.method,
                path=path,
                started=time.monotonic(),
                model_request=is_model_request(request.method, path),
                request_body=body,
            )
            with self._lock:
                self.exchanges.append(ex)
            headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP]
            url = path + (f"?{request.url.query}" if request.url.query else "")
            upstream = client.build_request(request.method, url, headers=headers, content=body)
            try:
                r = await client.send(upstream, stream=True)
            except httpx.HTTPError as exc:
                ex.status, ex.error = 502, f"{type(exc).__name__}: {exc}"[:500]
                ex.total_s = time.monotonic() - ex.started
                return Response(ex.error, status_code=502)
            ex.status = r.status_code
            ex.notes = {k: v for k, v in r.headers.items() if k.lower().startswith("x-loopstack-")}
            back = {k: v for k, v in r.headers.items() if k.lower() not in _HOP_BACK}
            ex.streamed = r.headers.get("content-type", "").startswith("text/event-stream")
            if not ex.streamed:
                whole = await r.aread()
                await r.aclose()
                now = time.monotonic()
                ex.finish_whole(whole, now)
                ex.total_s = now - ex.started
                return Response(whole, status_code=r.status_code, headers=back)

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in r.aiter_bytes():
                        ex.feed(chunk, time.monotonic())
                        yield chunk
                    ex.feed(b"\n", time.monotonic())
                finally:
                    ex.total_s = time.monotonic() - ex.started
                    await r.aclose()

            return StreamingResponse(relay(), status_code=r.status_code, headers=back)

        routes = [Route("/{path:path}", forward, methods=["GET", "POST", "DELETE"])]
        return Starlette(routes=routes)


@contextmanager
def running_proxy(upstream: str) -> Iterator[tuple[MeasuringProxy, str]]:
    """The proxy on a free port of 127.0.0.1 for the ``with`` block: it and its root URL."""
    proxy = MeasuringProxy(upstream)
    config = uvicorn.Config(
        proxy.app(), host="127.0.0.1", port=0, log_level="warning", timeout_keep_alive=30
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="clients-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ClientBenchError("the measuring proxy did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield proxy, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
