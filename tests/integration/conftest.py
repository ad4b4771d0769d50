"""One real server for the whole integration session: `loopstack serve` on the small offline
Qwen (the 0.5B, `OFFLINE_SMALL`; or LOOPSTACK_MODEL), started as a user would (but for a
smaller KV cache, see SMALL_KV), talked to with the official `openai` client.

The server is launched as soon as collection ends, and the unit tests run first while it
starts its engine (on a fresh machine ~2 min cold, after the model's one-time conversion, which
`make test` starts before lint); the `server` fixture then only waits for it to be healthy."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from openai import OpenAI

from loopstack.serving.config import OFFLINE_SMALL
from tests.integration.engine_counts import EngineCounts
from tests.ports import free_port

API_KEY = "test-key-123"
START_TIMEOUT_S = float(os.environ.get("LOOPSTACK_TEST_START_TIMEOUT", "1200"))
# The tests' servers keep 1 GiB of KV cache (43k tokens; no test needs more) instead of the
# default RAM/6 (3 GiB on 24 GiB): these VMs back fresh memory on first touch at ~90 MB/s
# (a 4 GiB numpy array took 44-48 s), so every GiB not allocated is ~11 s off an engine start,
# and the kill -9 test's engine starts beside the session's.
SMALL_KV = {"LOOPSTACK_CPU_KV_CACHE_GIB": "1"}
# The lifecycle tests end the session's server (marked `ends_server`, run after everything
# else): they kill its engine, which must first restart too slowly once, then SIGTERM it.
RESTART_TIMEOUT_S = 10.0  # far below any vLLM start (60-180 s here): the first restart times out
GRACE_S = 6.0
LIFECYCLE = {
    "LOOPSTACK_ENGINE_RESTART_TIMEOUT_S": str(RESTART_TIMEOUT_S),
    "LOOPSTACK_SHUTDOWN_GRACE_S": str(GRACE_S),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first (the server starts meanwhile), then the integration tests, and the
    tests that end the session's server last; the sort is stable, so each group keeps its
    order."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("ends_server") is not None,
            Path(__file__).parent in item.path.parents,
        )
    )


@dataclass
class Launch:
    """A `loopstack serve` started with the tests' settings (not yet healthy)."""

    proc: subprocess.Popen[bytes]
    base_url: str
    engine_url: str
    log: Path


_early: list[Launch] = []  # the session's server, launched when collection ends
_kill_9: list[Future[Any]] = []  # engine_procs.kill_9_during_start, begun when collection ends
# LOOPSTACK_TEST_COUNTS=<file>: each file's engine requests and tokens (engine_counts.py)
COUNTS_FILE = os.environ.get("LOOPSTACK_TEST_COUNTS")
_counts = EngineCounts()
_engine: list[str] = []  # the session engine's URL, once known


def launch_server() -> Launch:
    port, engine_port = free_port(), free_port()
    log = Path(tempfile.mkdtemp(prefix="loopstack-test-server-")) / "server.log"
    env = {
        "LOOPSTACK_API_KEY": API_KEY,
        "LOOPSTACK_ENGINE_PORT": str(engine_port),
        **SMALL_KV,
        **LIFECYCLE,
    }
    proc = start_server(log, env, port)
    return Launch(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}", log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch the session's server now when a selected test needs it, so that it starts
    while the unit tests run."""
    if session.config.option.collectonly or os.environ.get("LOOPSTACK_TEST_BASE_URL"):
        return
    if any("server" in getattr(item, "fixturenames", ()) for item in session.items):
        _early.append(launch_server())
        _engine.append(_early[0].engine_url)
    if any("kill_9" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.integration.engine_procs import kill_9_during_start  # it imports this file

        pool = ThreadPoolExecutor(1, thread_name_prefix="kill-9")
        _kill_9.append(pool.submit(kill_9_during_start))
        pool.shutdown(wait=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With LOOPSTACK_TEST_COUNTS: the engine's counters before and after each test."""
    if not COUNTS_FILE or Path(__file__).parent not in item.path.parents:
        yield
        return
    engine = os.environ.get("LOOPSTACK_TEST_ENGINE_URL") or (_engine[0] if _engine else None)
    _counts.begin(engine)
    yield
    _counts.end(item.path.name, engine)


def end_server(launch: Launch, *, keep_log: bool) -> None:
    """Stop a launched server (its whole process group) and remove its log directory, which
    a failed session keeps for reading."""
    stop(launch.proc)
    if launch in _early:
        _early.remove(launch)
    if not keep_log:
        shutil.rmtree(launch.log.parent, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop an early-launched server that no test came to use (a run cut short by -x or ^C)."""
    while _early:
        end_server(_early[0], keep_log=session.testsfailed > 0)
    if COUNTS_FILE and _counts.files:
        _counts.write(Path(COUNTS_FILE))
        print(f"\nengine counts per file ({COUNTS_FILE}):\n{_counts.table()}")


@dataclass
class Server:
    base_url: str
    engine_url: str
    model: str
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, **kw: object) -> OpenAI:
        return OpenAI(base_url=self.base_url + "/v1", api_key=API_KEY, max_retries=0, **kw)  # type: ignore[arg-type]

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_server(log: Path, env_extra: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LOOPSTACK_PORT": str(port), **env_extra}
    env.setdefault("LOOPSTACK_MODEL", OFFLINE_SMALL)  # behaviour is checked on the 0.5B
    return subprocess.Popen(
        [sys.executable, "-m", "loopstack", "serve"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"server not healthy in {timeout:.0f} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    reuse = os.environ.get("LOOPSTACK_TEST_BASE_URL")  # dev loop: a server you already run
    if reuse:
        models = httpx.get(reuse + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
        engine = os.environ.get("LOOPSTACK_TEST_ENGINE_URL", "")
        log = tmp_path_factory.mktemp("server") / "none.log"
        log.write_text("")
        yield Server(reuse, engine, models.json()["data"][0]["id"], None, log)  # type: ignore[arg-type]
        return
    launch = _early[0] if _early else launch_server()
    if not _engine:
        _engine.append(launch.engine_url)
    proc, base = launch.proc, launch.base_url
    try:
        wait_healthy(base, proc, launch.log, START_TIMEOUT_S)
        models = httpx.get(
            base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
        ).json()
        yield Server(base, launch.engine_url, models["data"][0]["id"], proc, launch.log)
    finally:
        end_server(launch, keep_log=request.session.testsfailed > 0)


@pytest.fixture
def kill_9() -> Any:
    """The outcome of engine_procs.kill_9_during_start (an engine start of its own, killed):
    begun when collection ended, so that its start overlaps the unit tests, else now."""
    if _kill_9:
        return _kill_9.pop().result()
    from tests.integration.engine_procs import kill_9_during_start

    return kill_9_during_start()


@pytest.fixture(scope="session")
def client(server: Server) -> OpenAI:
    return server.client(timeout=300)


K = TypeVar("K")


def send_at_once(client: OpenAI, requests: Mapping[K, dict[str, Any]]) -> dict[K, Future[Any]]:
    """Chat requests sent together (the engine batches them: a module's cases that do not need
    the engine to themselves cost one request's time, not one each); each case reads its own
    reply, or its error, from its future."""
    pool = ThreadPoolExecutor(len(requests))
    out = {key: pool.submit(client.chat.completions.create, **kw) for key, kw in requests.items()}
    pool.shutdown(wait=False)
    return out
