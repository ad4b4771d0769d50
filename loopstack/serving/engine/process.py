"""The engine's process: started through `loopstack.serving.engine.launcher`, owned, and killed as a
group.

`EngineProcess` starts ``python -m loopstack.serving.engine.launcher --parent <our pid> -- <vLLM
argv>`` in a new session, so the launcher leads a process group holding vLLM and everything vLLM
spawns. The server never signals vLLM directly: it signals that group (``SIGTERM``, then ``SIGKILL``
after a bounded wait). If the server dies without a word, the launcher notices and does the same.

Port helpers: before a start the engine port must be free; if it is not, `port_holder` names
the process listening on it (pid and command line, when the OS lets us see them), and a
listener is only trusted when it is one of our own launcher's descendants (`owned_listener`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from loopstack.serving.exceptions import EnginePortInUse

logger = logging.getLogger(__name__)

# `python -m loopstack.serving.engine.launcher`, importing it from the tree this server runs from
# (installed or not), without putting that tree on the engine's own import path.
_ROOT = str(Path(__file__).resolve().parents[3])
_LAUNCH = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "import loopstack.serving.engine.launcher as m; sys.exit(m.main())"
)


class EngineProcess:
    """One launch of the engine: the launcher process and its process group."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self._proc = proc

    @classmethod
    def spawn(cls, argv: Sequence[str], *, env: Mapping[str, str], grace_s: float) -> EngineProcess:
        """Start `argv` under the launcher, in a new session, with `env` over ours."""
        launcher = [sys.executable, "-c", _LAUNCH, _ROOT, "--parent", str(os.getpid())]
        launcher += ["--grace", f"{grace_s:g}", "--", *argv]
        proc = subprocess.Popen(
            launcher,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
            stderr=sys.stderr,
            start_new_session=True,
        )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def pids(self) -> set[int]:
        """The launcher and every live descendant (vLLM, its engine core, ...)."""
        try:
            root = psutil.Process(self._proc.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def kill_now(self) -> None:
        """SIGKILL the whole group at once; safe from any thread and from signal handlers."""
        for pid in self.pids() - {self._proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    async def terminate(self, timeout_s: float) -> None:
        """Ask the launcher to stop the engine; SIGKILL the group after `timeout_s`."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._proc.pid, signal.SIGTERM)
            for _ in range(math.ceil(timeout_s / 0.1)):
                if not self.alive():
                    break
                await asyncio.sleep(0.1)
        leftovers = self.pids()
        if timeout_s > 0 and (self.alive() or len(leftovers) > 1):
            logger.warning("engine did not stop in %.1f s: killing its process group", timeout_s)
        self.kill_now()
        for _ in range(25):  # SIGKILL is not instantaneous; reap the launcher
            if self._proc.poll() is not None:
                break
            await asyncio.sleep(0.02)


# ----------------------------------------------------------------------------- the port
def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could bind `host:port` now (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def listener_pids(port: int) -> set[int]:
    """Pids listening on TCP `port` that this user may see (empty when the OS hides them)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return set()
    return {
        c.pid
        for c in conns
        if c.pid is not None and c.laddr and c.laddr.port == port and c.status == "LISTEN"
    }


def port_holder(port: int) -> str:
    """A human description of what listens on `port`."""
    pids = sorted(listener_pids(port))
    if not pids:
        return "a process this user cannot see (another user's, or a container's)"
    parts = []
    for pid in pids:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())[:300] or "?"
        except psutil.Error:
            cmd = "?"
        parts.append(f"pid {pid} ({cmd})")
    return ", ".join(parts)


def ensure_port_free(port: int) -> None:
    """Raise `EnginePortInUse`, naming the holder, unless the engine port is free."""
    if port_is_free(port):
        return
    raise EnginePortInUse(
        f"the engine port {port} is already in use by {port_holder(port)}. loopstack starts "
        "its own engine and never adopts one it did not start: stop that process (an engine "
        "left over from an older loopstack can be killed safely), or pick another port with "
        "LOOPSTACK_ENGINE_PORT, or point LOOPSTACK_ENGINE_URL at an engine you run yourself."
    )


def owned_listener(port: int, proc: EngineProcess) -> bool | None:
    """Whether the listener on `port` belongs to `proc`'s tree; None if the OS will not say."""
    pids = listener_pids(port)
    if not pids:
        return None
    return bool(pids & proc.pids())
