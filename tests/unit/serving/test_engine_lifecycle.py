"""The engine's lifecycle with real processes: `VLLMEngine` starts `fake_vllm.py` (vLLM's
port, key and child process, in a few hundred ms) through the real launcher, so process
groups, parent death, restarts and identity checks run for real, without the model."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from loopstack.serving.engine import supervisor as engine_mod
from loopstack.serving.engine.process import ensure_port_free, port_is_free
from loopstack.serving.engine.supervisor import Backoff, VLLMEngine, read_engine_key
from loopstack.serving.engine.transport import collect
from loopstack.serving.exceptions import EnginePortInUse, EngineStartError, EngineUnavailable
from tests.ports import free_port
from tests.unit.serving.serving_fakes import MODEL as FAKE_MODEL
from tests.unit.serving.serving_fakes import Harness

COMPLETIONS = "/v1/completions"

FAKE = str(Path(__file__).with_name("fake_vllm.py"))
ROOT = str(Path(__file__).resolve().parents[3])
MODEL = "fake"


def all_gone(pids: set[int], timeout: float) -> float | None:
    """Seconds until every pid is gone (zombies count as gone), None if not in `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        alive = [p for p in pids if psutil.pid_exists(p) and not _zombie(p)]
        if not alive:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def make_engine(port: int, tmp_path: Path, **kw: object) -> VLLMEngine:
    argv = [sys.executable, FAKE, "--port", str(port), "--served-model-name", MODEL]
    defaults: dict[str, object] = {
        "env": {},
        "port": port,
        "model_name": MODEL,
        "start_timeout_s": 20.0,
        "stop_grace_s": 1.0,
        "key_dir": tmp_path / "run",
        "backoff": Backoff(first_s=0.05, max_s=0.2),
    }
    defaults.update(kw)
    return VLLMEngine(argv, **defaults)  # type: ignore[arg-type]


@pytest.fixture
def stranger() -> Iterator[tuple[int, list[str]]]:
    """A foreign HTTP server that says yes to everything, as an orphaned engine would."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.path)
            body = b'{"object": "list", "data": [{"id": "fake"}]}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1], seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff(first_s=1, factor=2, max_s=30)
    assert [b.delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert b.delay(10_000) == 30


async def test_start_proves_identity_and_stop_kills_the_group(tmp_path: Path) -> None:
    port = free_port()
    engine = make_engine(port, tmp_path)
    await engine.start()
    try:
        assert engine.state == "ready" and await engine.healthy()
        pids = engine.engine_pids()
        assert len(pids) >= 3, pids  # launcher, "vLLM", its "engine core"
        key = read_engine_key(tmp_path / "run", port)
        assert key and (tmp_path / "run" / f"engine-{port}.key").stat().st_mode & 0o077 == 0
        assert key not in " ".join(" ".join(psutil.Process(p).cmdline()) for p in pids)
        assert (await collect(engine.transport, COMPLETIONS, {"prompt": "x"}))["model"] == MODEL
    finally:
        await engine.stop()
    assert all_gone(pids, 3) is not None
    assert read_engine_key(tmp_path / "run", port) is None
    assert port_is_free(port)


async def test_port_taken_is_refused_and_the_stranger_is_never_used(
    tmp_path: Path, stranger: tuple[int, list[str]]
) -> None:
    port, seen = stranger
    with pytest.raises(EnginePortInUse) as err:
        ensure_port_free(port)
    assert f"port {port}" in str(err.value) and f"pid {os.getpid()}" in str(err.value)
    engine = make_engine(port, tmp_path)
    with pytest.raises(EnginePortInUse):
        await engine.start()
    assert seen == [] and engine.engine_pids() == set()


async def test_a_stranger_that_wins_the_race_is_not_adopted(
    tmp_path: Path, stranger: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Port free at the check, then a stranger binds it first: our engine cannot bind; the
    stranger answers /health and accepts any key, but it is not our process."""
    port, seen = stranger
    monkeypatch.setattr(engine_mod, "ensure_port_free", lambda _port: None)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # alive, never listens
    engine = make_engine(port, tmp_path)
    engine.argv = argv
    with pytest.raises(EngineStartError, match="did not start"):
        await engine.start()
    assert "/v1/models" in seen and not any(p.startswith("/v1/c") for p in seen)


async def test_watchdog_restarts_a_killed_engine_and_never_closes_the_client(
    tmp_path: Path,
) -> None:
    port = free_port()
    pid_log = tmp_path / "pids"
    engine = make_engine(port, tmp_path, env={"FAKE_VLLM_PIDS": str(pid_log)})
    await engine.start()
    watchdog = asyncio.create_task(engine.supervise(interval_s=0.1))
    try:
        api, core = map(int, pid_log.read_text().split())
        os.kill(api, signal.SIGKILL)  # vLLM itself dies (OOM killer); its core is orphaned
        assert await asyncio.to_thread(all_gone, {api, core}, 5) is not None
        seen_unavailable = False
        deadline = time.monotonic() + 20
        while not await engine.healthy():
            assert time.monotonic() < deadline, "no recovery"
            with contextlib.suppress(EngineUnavailable):
                await collect(engine.transport, COMPLETIONS, {"prompt": "x"})
                continue
            seen_unavailable = True
            await asyncio.sleep(0.05)
        assert seen_unavailable and engine.restarts == 1
        assert (await collect(engine.transport, COMPLETIONS, {"prompt": "x"}))["model"] == MODEL
        assert len(pid_log.read_text().split()) == 4  # a second, new engine
    finally:
        watchdog.cancel()
        await engine.stop()


async def test_a_restart_waits_for_the_killed_engine_to_let_go_of_its_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A big engine takes a moment to die after SIGKILL; its port is held meanwhile (here: by
    a socket the test closes 0.5 s later). The restart waits for it instead of failing."""
    port = free_port()
    engine = make_engine(port, tmp_path, restart_timeout_s=10.0)
    await engine.start()
    try:
        pids = engine.engine_pids()  # before the kill: a killed launcher's children are reparented
        engine._proc.kill_now()  # type: ignore[union-attr]
        assert await asyncio.to_thread(all_gone, pids, 5) is not None
        dying = socket.socket()
        dying.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        dying.bind(("127.0.0.1", port))
        dying.listen()
        threading.Timer(0.5, dying.close).start()
        await asyncio.wait_for(engine.restart(), 30)
        failed = [r.getMessage() for r in caplog.records if "restart attempt" in r.getMessage()]
        assert failed == []
        assert engine.state == "ready" and await engine.healthy()
    finally:
        await engine.stop()


async def test_a_restart_that_times_out_is_retried_with_more_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first restart attempt is given 0.3 s but the engine needs ~1 s: it times out, the
    engine group is killed, and the next attempt, with the start timeout, succeeds."""
    port = free_port()
    engine = make_engine(port, tmp_path, restart_timeout_s=0.3, start_timeout_s=10.0)
    await engine.start()
    try:
        engine.env = {"FAKE_VLLM_DELAY": "0.8"}
        engine._proc.kill_now()  # type: ignore[union-attr]
        started = time.monotonic()
        await asyncio.wait_for(engine.restart(), 30)
        assert engine.state == "ready" and await engine.healthy()
        failed = [r.getMessage() for r in caplog.records if "restart attempt" in r.getMessage()]
        assert len(failed) == 1 and "did not become healthy in 0.3 s" in failed[0], failed
        assert time.monotonic() - started > 0.3
        assert (await collect(engine.transport, COMPLETIONS, {"prompt": "x"}))["model"] == MODEL
    finally:
        await engine.stop()


async def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    port = free_port()
    engine = make_engine(port, tmp_path, env={"FAKE_VLLM_IGNORE_TERM": "1"}, stop_grace_s=0.5)
    await engine.start()
    pids = engine.engine_pids()
    started = time.monotonic()
    await engine.stop()
    assert time.monotonic() - started < 3.0
    assert all_gone(pids, 2) is not None


SERVER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from loopstack.serving.engine.process import EngineProcess
    proc = EngineProcess.spawn({argv!r}, env={{}}, grace_s=1.0)
    print(proc.pid, flush=True)
    time.sleep(600)
    """
)


def test_kill_9_of_the_server_takes_the_engine_group_with_it(tmp_path: Path) -> None:
    port = free_port()
    pid_log = tmp_path / "pids"
    argv = [sys.executable, FAKE, "--port", str(port)]
    script = SERVER_SCRIPT.format(root=ROOT, argv=argv)
    server = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={**os.environ, "FAKE_VLLM_PIDS": str(pid_log)},
    )
    try:
        launcher = int(server.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while not (pid_log.exists() and len(pid_log.read_text().split()) == 2):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids = {launcher, *map(int, pid_log.read_text().split())}
        server.kill()
        server.wait()
        took = all_gone(pids, 10)
        assert took is not None, "engine processes outlived the server"
        assert took < 5.0  # slack: the unit tests share 2 cores with the starting test server
    finally:
        if server.poll() is None:
            server.kill()


STUCK_APP = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    import uvicorn
    from fastapi import FastAPI
    from loopstack.serving.server import BoundedServer

    app = FastAPI()

    @app.get("/stuck")
    async def stuck() -> dict:
        time.sleep(600)  # blocks the event loop itself
        return {{}}

    def deadline() -> None:
        open({marker!r}, "w").write("engine killed")

    config = uvicorn.Config(app, port={port}, log_config=None, timeout_graceful_shutdown=1)
    BoundedServer(config, grace_s=2.0, on_deadline=deadline).run()
    """
)


def test_sigterm_ends_a_server_whose_event_loop_is_stuck(tmp_path: Path) -> None:
    import httpx

    port = free_port()
    marker = tmp_path / "deadline"
    script = STUCK_APP.format(root=ROOT, port=port, marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120  # its start (imports) on a loaded box: not measured
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)

        def stuck_request() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/stuck", timeout=30)

        threading.Thread(target=stuck_request, daemon=True).start()
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        took = time.monotonic() - started
        # the deadline (2 s), not a graceful exit, ended it; slack for a loaded machine
        assert 1.5 < took < 2.0 + 2.5, took
        assert marker.read_text() == "engine killed" and proc.returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_offline_gguf_is_hashed_before_reuse_and_stamped(tmp_path: Path) -> None:
    import hashlib

    from loopstack.serving.engine.model_store import assemble_parts, verified

    parts = [tmp_path / "p1", tmp_path / "p2"]
    parts[0].write_bytes(b"a" * 1000)
    parts[1].write_bytes(b"b" * 24)
    sha = hashlib.sha256(b"a" * 1000 + b"b" * 24).hexdigest()
    gguf = assemble_parts(parts, tmp_path / "m.gguf", sha256=sha)
    assert verified(gguf, sha256=sha, size=1024)  # the stamp written by assemble_parts
    stamp = tmp_path / "m.gguf.sha256"
    assert stamp.read_text().split()[0] == sha
    with gguf.open("r+b") as fh:  # same size, different bytes (and a new mtime)
        fh.write(b"X")
    assert not verified(gguf, sha256=sha, size=1024)
    gguf.write_bytes(b"a" * 1000 + b"b" * 24)
    stamp.unlink()
    assert verified(gguf, sha256=sha, size=1024) and stamp.exists()  # hashed, then stamped
    assert not verified(gguf, sha256=sha, size=1023)


async def test_router_answers_503_with_retry_after_while_the_engine_restarts(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.engine.is_healthy = False
    r = await harness.client.get("/health")
    assert r.status_code == 503 and r.headers["retry-after"] == str(engine_mod.ENGINE_RETRY_AFTER_S)

    async def restarting(path: str, body: dict[str, object]) -> dict[str, object]:
        raise EngineUnavailable("the engine is restarting", retry_after_s=5)

    monkeypatch.setattr(harness.engine, "_post", restarting)
    body = {"model": FAKE_MODEL, "prompt": "x", "max_tokens": 3}
    r = await harness.client.post("/v1/completions", json=body)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_a_second_layer_finds_the_local_engine_key(tmp_path: Path) -> None:
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.server import _engine_key

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "engine-8123.key").write_text("k-123\n")
    local = ServerSettings(home=tmp_path, engine_url="http://127.0.0.1:8123/v1")
    assert _engine_key(local) == "k-123"
    explicit = local.model_copy(update={"engine_api_key": "mine"})
    assert _engine_key(explicit) == "mine"
    remote = ServerSettings(home=tmp_path, engine_url="http://10.0.0.5:8123")
    assert _engine_key(remote) is None
    assert _engine_key(ServerSettings(home=tmp_path)) is None  # we start it: a fresh key


FULL_APP = textwrap.dedent(
    """
    import contextlib, sys
    sys.path.insert(0, {root!r})
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from loopstack.serving.engine.supervisor import VLLMEngine
    from loopstack.serving.server import ShutdownBudget, run_bounded

    engine = VLLMEngine(
        [sys.executable, {fake!r}, "--port", "{eport}"], env={{}}, port={eport},
        model_name="fake", stop_grace_s=ShutdownBudget({grace}).engine_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_):
        await engine.start()
        open({ready!r}, "w").write(str(engine._proc.pid))
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(lifespan=lifespan)

    @app.get("/stream")
    async def stream():
        lines = engine.transport.send("/v1/completions", {{"stream": True, "max_tokens": 100000}})
        return StreamingResponse((line + b"\\n\\n" async for line in lines))

    run_bounded(app, engine, "127.0.0.1", {port}, {grace}, keep_alive_s=5)
    """
)


@pytest.mark.parametrize("stubborn", [False, True], ids=["engine-obeys", "engine-ignores-term"])
def test_sigterm_with_a_streaming_request_stops_server_and_engine_in_grace(
    tmp_path: Path, stubborn: bool
) -> None:
    """`serve`'s shutdown path with a request that would stream for hours: the server and
    every engine process are gone within the grace period."""
    import httpx

    grace = 3.0
    port, eport = free_port(), free_port()
    ready, pid_log = tmp_path / "ready", tmp_path / "pids"
    script = FULL_APP.format(
        root=ROOT, fake=FAKE, eport=eport, port=port, grace=grace, ready=str(ready)
    )
    env = {**os.environ, "FAKE_VLLM_PIDS": str(pid_log)}
    if stubborn:
        env["FAKE_VLLM_IGNORE_TERM"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.3)  # uvicorn binds after the lifespan startup
        pids = {int(ready.read_text()), *map(int, pid_log.read_text().split())}
        got: list[bytes] = []

        def long_stream() -> None:
            with (
                contextlib.suppress(httpx.HTTPError),
                httpx.stream("GET", f"http://127.0.0.1:{port}/stream", timeout=30) as r,
            ):
                for chunk in r.iter_bytes():
                    got.append(chunk)

        threading.Thread(target=long_stream, daemon=True).start()
        while len(got) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace + 5)
        took = time.monotonic() - started
        gone = all_gone(pids, 1.0)
        assert took <= grace + 2.0, took  # the stream would last 30 s
        assert gone is not None, "engine processes outlived the server"
        assert port_is_free(eport)
    finally:
        if proc.poll() is None:
            proc.kill()
