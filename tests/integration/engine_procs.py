"""The engine's processes under a `loopstack serve` (psutil), and the kill -9 check that
needs an engine start of its own: `kill_9_during_start` starts a server, kills it with
SIGKILL while vLLM loads the model, and says how fast the engine's processes went.

That start costs ~50 s of one core here, so `make test`'s session runs it from the moment
collection ends (tests/integration/conftest.py, fixture `kill_9`), beside the unit tests that
leave the box half idle; the test then only reads the outcome."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from loopstack.serving.engine.process import port_is_free
from tests.integration.conftest import API_KEY, SMALL_KV, START_TIMEOUT_S, start_server
from tests.ports import free_port


def engine_tree(server_pid: int) -> list[psutil.Process]:
    """Every process below the server (the launcher, vLLM and vLLM's own children)."""
    try:
        return psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return []


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join([p.name(), *p.cmdline()])
    except psutil.Error:
        return ""


def engine_procs(server_pid: int) -> list[psutil.Process]:
    """The launcher, vLLM's API server, its engine core and workers."""
    return [p for p in engine_tree(server_pid) if "vllm" in _cmd(p).lower()]


def vllm_api(server_pid: int) -> psutil.Process:
    for p in engine_tree(server_pid):
        cmd = _cmd(p)
        if (
            "vllm.entrypoints.openai.api_server" in cmd
            and "loopstack.serving.engine.launcher" not in cmd
        ):
            return p
    raise AssertionError("no vLLM process under the server")


def seconds_until_gone(pids: set[int], timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        alive = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        if not alive:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


@dataclass
class Kill9:
    """What `kill_9_during_start` saw; `failed` says why it could not kill at all."""

    processes: int = 0
    gone_in_s: float | None = None
    port_free: bool = False
    failed: str | None = None


def kill_9_during_start() -> Kill9:
    """kill -9 of a server while vLLM loads the model (its engine core already spawned): the
    engine's processes must go with it and free the engine port."""
    folder = Path(tempfile.mkdtemp(prefix="loopstack-kill-9-"))
    log, engine_port = folder / "server.log", free_port()
    env = {"LOOPSTACK_API_KEY": API_KEY, "LOOPSTACK_ENGINE_PORT": str(engine_port), **SMALL_KV}
    proc = start_server(log, env, free_port())
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(engine_procs(proc.pid)) < 3:  # launcher, vLLM, engine core
            if proc.poll() is not None:
                return Kill9(failed=f"server exited:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                return Kill9(failed="the engine never started")
            time.sleep(0.5)
        time.sleep(2)
        pids = {p.pid for p in engine_tree(proc.pid)}
        proc.kill()
        proc.wait()
        took = seconds_until_gone(pids, 10)
        return Kill9(len(pids), took, port_is_free(engine_port))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
