"""Idle client connections outlive the clients' own 5 s idle expiry (`LOOPSTACK_KEEP_ALIVE_S`).

With uvicorn's default of 5 s, a client that reuses a connection idle for ~5 s races the
server closing it, and that request is lost without an answer (seen once in the soak)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loopstack.serving.config import ServerSettings
from tests.ports import free_port

ROOT = str(Path(__file__).resolve().parents[3])
APP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from fastapi import FastAPI
    from loopstack.serving.server import run_bounded

    app = FastAPI()

    @app.get("/health")
    async def health():
        return {{"status": "ok"}}

    run_bounded(app, object(), "127.0.0.1", {port}, 3.0, keep_alive_s={keep_alive_s})
    """
)


@contextmanager
def serving(keep_alive_s: int) -> Iterator[int]:
    port = free_port()
    script = APP.format(root=ROOT, port=port, keep_alive_s=keep_alive_s)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def answered_after_idle(port: int, idle_s: float) -> bool:
    """One request, `idle_s` of silence, then a second request on the same connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        sock = conn.sock
        time.sleep(idle_s)
        try:
            conn.request("GET", "/health")
            second = conn.getresponse()
        except (OSError, http.client.HTTPException):
            return False
        assert conn.sock is sock  # the same connection, not a new one
        return second.status == 200
    finally:
        conn.close()


def test_the_default_outlives_a_clients_5_s_idle_expiry() -> None:
    with serving(ServerSettings().keep_alive_s) as port:
        assert answered_after_idle(port, 6.0)


def test_the_setting_is_what_closes_the_connection() -> None:
    with serving(1) as port:
        assert not answered_after_idle(port, 2.5)
