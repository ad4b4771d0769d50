"""A pass-through HTTP proxy in front of the real vLLM that can hold one marked request.

Fault injection for the admission tests: a request whose body carries `HOLD_MARKER` gets its
first streamed line through, then waits until the test releases it (or hangs up). The server
under test is then certainly mid-stream, holding its slot, whatever the machine's speed; no
test has to guess how long a generation takes. Everything else is forwarded unchanged, so the
answers still come from the real model.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

HOLD_MARKER = "[loopstack-test: hold this request]"
_HOP_HEADERS = {b"host", b"content-length", b"connection", b"accept-encoding"}


class HoldingProxy:
    def __init__(self, upstream: str, *, hold_limit_s: float = 120.0):
        self.upstream = upstream
        self.hold_limit_s = hold_limit_s
        self.holding = threading.Event()  # a marked request has sent its first line and waits
        self.release = threading.Event()
        self.log: list[str] = []  # what passed through, with times: the failure message shows it
        self._t0 = time.monotonic()

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self._t0:7.2f}s {what}")

    def app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=600)

        async def forward(request: Request) -> Response:
            body = await request.body()
            headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP_HEADERS]
            url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            hold = HOLD_MARKER.encode() in body
            self.note(f"{request.method} {request.url.path}{' (held)' if hold else ''}")
            upstream = client.build_request(request.method, url, headers=headers, content=body)
            r = await client.send(upstream, stream=True)
            passed = {"content-type": r.headers.get("content-type", "application/json")}

            async def lines() -> AsyncIterator[bytes]:
                try:
                    first = True
                    async for chunk in r.aiter_bytes():
                        yield chunk
                        if hold and first:
                            first = False
                            self.holding.set()
                            self.note("held after the first chunk")
                            await self._wait_release()
                            self.note("released")
                finally:
                    await r.aclose()

            return StreamingResponse(lines(), status_code=r.status_code, headers=passed)

        routes = [Route("/{path:path}", forward, methods=["GET", "POST"])]
        return Starlette(routes=routes)

    async def _wait_release(self) -> None:
        # A thread waits (the proxy's loop stays free); leaving the proxy sets `release`.
        await asyncio.to_thread(self.release.wait, self.hold_limit_s)


@contextmanager
def running_proxy(upstream: str, port: int) -> Iterator[HoldingProxy]:
    """The proxy on 127.0.0.1:`port`, in a thread of this process, for the `with` block."""
    proxy = HoldingProxy(upstream)
    config = uvicorn.Config(proxy.app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="holding-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the holding proxy did not start")
        time.sleep(0.05)
    try:
        yield proxy
    finally:
        proxy.release.set()
        server.should_exit = True
        thread.join(15)
