"""What the MCP integration suites share: a fixture MCP server over streamable HTTP, in its own
process group, ready when its endpoint answers, killed (group and all) afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

import httpx

from tests.ports import free_port


@contextlib.contextmanager
def mcp_http_server(
    script: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``script http PORT``; yields its ``/mcp`` URL and the process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, script, "http", str(port)],
        env=None if env is None else dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1)
            break
        time.sleep(0.1)
    try:
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
