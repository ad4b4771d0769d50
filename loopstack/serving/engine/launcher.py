"""The engine's launcher: ``python -m loopstack.serving.engine.launcher --parent PID --grace S --
<argv>``.

`loopstack serve` never starts vLLM directly; it starts this small process in a new session
(its own process group), which starts vLLM inside that group and then only watches. It exists
so that the engine dies with the server however the server dies:

* **Parent death.** On Linux the kernel sends the launcher ``SIGUSR1`` when its parent dies
  (``PR_SET_PDEATHSIG``); on every platform it also polls ``os.getppid()`` twice a second. Either
  way (``kill -9`` of the server, the OOM killer, a crash) it stops the engine group.
* **Everything the engine spawned.** The launcher is a child subreaper (Linux), so processes
  vLLM started (its engine core) are re-parented to it if vLLM itself dies; stopping kills the
  whole process group and every descendant still alive.
* **Bounded stop.** ``SIGTERM``/``SIGINT`` (from the server, or parent death) sends ``SIGTERM`` to
  the group, waits at most ``--grace`` seconds, then ``SIGKILL``s what is left.
* **Crash.** If vLLM exits on its own, leftovers are killed and the launcher exits with vLLM's
  status (negative signal numbers become 128+N), which the server's watchdog sees.

It imports nothing from `serving` and nothing outside the standard library but `psutil`, so it
starts in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.25
PARENT_POLL_S = 0.5


def _prctl(option: int, value: int) -> bool:
    """prctl(2) on Linux; False anywhere it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def exit_with_parent() -> None:
    """For a helper process of the server (a compile worker): go when the server goes, even
    by kill -9. SIGKILL from the kernel on Linux; elsewhere a thread watching the parent."""
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    import threading

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _die_with_parent() -> None:
    """preexec_fn for the engine: SIGTERM when the launcher dies (it is single-threaded)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _descendants() -> list[Any]:
    try:
        import psutil

        return list(psutil.Process().children(recursive=True))
    except Exception:  # psutil missing or the table changed under us: the group kill remains
        return []


def _signal_all(sig: int) -> None:
    """`sig` to our process group (not to ourselves) and to every descendant."""
    for proc in _descendants():
        with contextlib.suppress(Exception):
            proc.send_signal(sig)
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgrp(), sig)
    finally:
        signal.signal(sig, previous)


class _Children:
    """Reaps every exited child (as a subreaper we inherit orphans) and keeps the engine's
    exit status; no `psutil` in this loop, it runs four times a second."""

    def __init__(self, engine_pid: int):
        self.engine_pid = engine_pid
        self.engine_code: int | None = None

    def reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    return
                if pid == self.engine_pid:
                    self.engine_code = os.waitstatus_to_exitcode(status)


def stop_group(children: _Children, grace_s: float) -> None:
    """SIGTERM the engine's group; SIGKILL whatever is still alive after `grace_s`."""
    _signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        children.reap()
        if children.engine_code is not None and not _descendants():
            return
        time.sleep(0.1)
    for proc in _descendants():
        with contextlib.suppress(Exception):
            proc.kill()
    time.sleep(0.05)
    children.reap()


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def run(argv: Sequence[str], *, parent: int, grace_s: float) -> int:
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop_reason: list[str] = []

    def on_signal(sig: int, _frame: object) -> None:
        if sig == signal.SIGUSR1 and os.getppid() == parent:
            return  # the thread that started us ended, not the server: nothing to do
        stop_reason.append(signal.Signals(sig).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    if os.getppid() != parent:  # the server died before the death signal was armed
        return 1
    engine = subprocess.Popen(list(argv), preexec_fn=_die_with_parent)
    children = _Children(engine.pid)
    last_parent_check = 0.0
    while True:
        children.reap()
        if children.engine_code is not None:
            code = children.engine_code
            stop_group(children, grace_s)  # vLLM died: its engine core must not outlive it
            return _exit_status(code)
        now = time.monotonic()
        if now - last_parent_check >= PARENT_POLL_S:
            last_parent_check = now
            if os.getppid() != parent:
                stop_reason.append("parent died")
        if stop_reason:
            print(
                f"loopstack launcher: stopping the engine ({stop_reason[0]})",
                file=sys.stderr,
                flush=True,
            )
            stop_group(children, grace_s)
            return 0
        time.sleep(POLL_S)


def main(args: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loopstack.serving.engine.launcher", description=__doc__
    )
    ap.add_argument("--parent", type=int, required=True, help="pid of the server")
    ap.add_argument("--grace", type=float, default=5.0, help="SIGTERM -> SIGKILL delay (s)")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- engine command line")
    ns = ap.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        ap.error("no engine command given after --")
    return run(argv, parent=ns.parent, grace_s=ns.grace)


if __name__ == "__main__":
    sys.exit(main())
