"""Process lifecycle with the real engine: `loopstack serve` + vLLM, faults as an operator
meets them. The engine never outlives the server, a stranger on the engine port is never
adopted, SIGTERM is bounded, and the watchdog brings a killed engine back by itself.

The kill -9 test starts a server of its own and kills it during its engine's start (begun
when collection ends, beside the unit tests: tests/integration/engine_procs.py). The last
two end the session's server (marked `ends_server`, so they run after every other test): one
engine start saved, and no second engine beside the session's. Its engine is killed
mid-stream and must come back through a restart attempt that times out; then the server is
SIGTERMed during a long request. With a reused server (LOOPSTACK_TEST_BASE_URL) they start
one of their own instead. Timings are printed (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from loopstack.serving.engine.process import port_is_free
from tests.integration.conftest import (
    API_KEY,
    GRACE_S,
    RESTART_TIMEOUT_S,
    START_TIMEOUT_S,
    Server,
    end_server,
    free_port,
    launch_server,
    start_server,
    wait_healthy,
)
from tests.integration.engine_procs import Kill9, engine_procs, seconds_until_gone, vllm_api

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_a_taken_engine_port_is_refused_and_the_stranger_never_used(tmp_path: Path) -> None:
    seen: list[str] = []

    class Stranger(http.server.BaseHTTPRequestHandler):  # an orphan engine says yes to all
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.path)
            body = b'{"object": "list", "data": [{"id": "qwen2.5-coder-0.5b-instruct"}]}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    stranger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stranger)
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    taken = stranger.server_address[1]
    log = tmp_path / "server.log"
    started = time.monotonic()
    proc = start_server(
        log, {"LOOPSTACK_API_KEY": API_KEY, "LOOPSTACK_ENGINE_PORT": str(taken)}, free_port()
    )
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        stranger.shutdown()
        stranger.server_close()
    text = log.read_text()
    print(f"\nport taken: refused in {time.monotonic() - started:.1f} s, exit {code}")
    assert code == 2, text[-3000:]
    assert f"engine port {taken} is already in use by pid {os.getpid()}" in text, text[-3000:]
    assert seen == [], "the server talked to a process it did not start"


def test_kill_9_of_the_server_leaves_no_engine_behind(kill_9: Kill9) -> None:
    """kill -9 while vLLM loads the model (its engine core already spawned); the server was
    started when collection ended (engine_procs.kill_9_during_start)."""
    assert kill_9.failed is None, kill_9.failed
    print(f"\nkill -9: {kill_9.processes} engine processes gone in {kill_9.gone_in_s} s")
    assert kill_9.gone_in_s is not None, "engine processes outlived the server by 10 s"
    assert kill_9.port_free


@dataclass
class Life:
    base: str
    proc: subprocess.Popen[bytes]
    pid: int
    log: Path
    model: str
    engine_port: int


@pytest.fixture(scope="module")
def life(server: Server, request: pytest.FixtureRequest) -> Iterator[Life]:
    """The session's server if the tests started it (the tests using this end it), else one
    of our own: a reused server is never killed."""
    if server.proc is not None:
        engine_port = urlsplit(server.engine_url).port
        assert engine_port is not None
        yield Life(
            server.base_url, server.proc, server.proc.pid, server.log, server.model, engine_port
        )
        return
    started = time.monotonic()
    own = launch_server()
    base, proc, log = own.base_url, own.proc, own.log
    engine_port = urlsplit(own.engine_url).port
    assert engine_port is not None
    try:
        wait_healthy(base, proc, log, START_TIMEOUT_S)
        print(f"\nserver healthy in {time.monotonic() - started:.0f} s")
        model = httpx.get(base + "/v1/models", headers=AUTH).json()["data"][0]["id"]
        yield Life(base, proc, proc.pid, log, model, engine_port)
    finally:
        end_server(own, keep_log=request.session.testsfailed > 0)


@pytest.mark.ends_server
def test_engine_killed_mid_stream_and_a_slow_restart_recover_by_themselves(life: Life) -> None:
    client = openai.OpenAI(base_url=life.base + "/v1", api_key=API_KEY, max_retries=0)
    stream = client.chat.completions.create(
        model=life.model,
        messages=[{"role": "user", "content": "Count from 1 to 500."}],
        max_tokens=400,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    got = 0
    victim = vllm_api(life.pid)
    with pytest.raises(openai.APIError) as err:
        for _ in stream:
            got += 1
            if got == 3:
                victim.kill()
                killed = time.monotonic()
    print(f"\nmid-stream: {got} chunks, then {type(err.value).__name__}: {err.value}")
    assert 3 <= got < 400

    saw_503 = saw_request_503 = False
    deadline = time.monotonic() + RESTART_TIMEOUT_S + START_TIMEOUT_S
    while True:
        r = httpx.get(life.base + "/health", timeout=10)
        if r.status_code == 200:
            break
        assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
        saw_503 = True
        if not saw_request_503:
            body = {"model": life.model, "messages": [{"role": "user", "content": "hi"}]}
            q = httpx.post(life.base + "/v1/chat/completions", json=body, headers=AUTH)
            if q.status_code == 503:
                assert q.headers.get("retry-after"), q.headers
                saw_request_503 = True
        assert time.monotonic() < deadline, life.log.read_text()[-3000:]
        assert life.proc.poll() is None
        time.sleep(1)
    recovered = time.monotonic() - killed
    log = life.log.read_text()
    print(f"engine killed -> healthy again in {recovered:.0f} s")
    assert saw_503 and saw_request_503
    assert f"did not become healthy in {RESTART_TIMEOUT_S:g} s" in log, "no slow attempt"
    assert "vLLM restarted in" in log
    done = client.chat.completions.create(
        model=life.model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=5
    )
    assert done.choices[0].message.content


@pytest.mark.ends_server
def test_sigterm_during_a_long_request_ends_within_the_grace_period(life: Life) -> None:
    pids = {p.pid for p in engine_procs(life.pid)}
    assert len(pids) >= 3
    body = {
        "model": life.model,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    got: list[int] = []

    def long_request() -> None:
        url = life.base + "/v1/chat/completions"
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("POST", url, json=body, headers=AUTH, timeout=120) as r,
        ):
            for _ in r.iter_lines():
                got.append(1)

    threading.Thread(target=long_request, daemon=True).start()
    deadline = time.monotonic() + 60
    while len(got) < 3:
        assert time.monotonic() < deadline, "the long request never streamed"
        time.sleep(0.1)
    started = time.monotonic()
    os.kill(life.pid, signal.SIGTERM)
    life.proc.wait(GRACE_S + 30)
    took = time.monotonic() - started
    # Every engine process has had SIGKILL by now, but the kernel may need a while to tear
    # down vLLM's multi-GB worker on a loaded machine (measured: 4 s at load 15, more under
    # memory pressure), hence a looser bound than the server's own exit.
    gone = seconds_until_gone(pids, 30)
    print(f"\nSIGTERM during a long request: exit in {took:.1f} s, engine gone +{gone} s")
    assert took <= GRACE_S + 1.0
    assert gone is not None, "engine processes outlived the server by 30 s"
    assert port_is_free(life.engine_port)
