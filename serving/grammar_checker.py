"""The bounded compile of a turn's grammar, and building the configured constraint backend.

vLLM has no timeout on compiling JSON-schema or structural-tag grammars, so every grammar
backend's payload is compiled here first, with the engine's own library and the model's
vocabulary, in a worker process with a deadline and a memory ceiling (`GrammarChecker`):
past it, 400 ``schema_too_complex`` and the engine never sees it. `make_backend` builds the
backend `LOOPSTACK_CONSTRAINT_BACKEND` names (`serving.server` calls it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from serving.backend_guidance import GuidanceBackend
from serving.backend_outlines import OutlinesBackend
from serving.backend_xgrammar import XGrammarBackend
from serving.compile_worker import too_complex
from serving.constraint_backend import BackendName, ConstraintBackend
from serving.exceptions import InvalidRequest

logger = logging.getLogger(__name__)

# What one compile may add to the worker's address space, on top of its libraries and the
# model's vocabulary (measured once they are loaded, so a larger build of a library - the
# CUDA torch that xgrammar imports on a GPU box maps ~3 GiB more than the CPU one - or a
# larger vocabulary does not eat into it). Past it a compile fails with MemoryError or kills
# the worker: 400 schema_too_complex either way.
COMPILE_BUDGET = 3 << 30
STARTUP_S = 60.0  # a fresh worker loads the model's vocabulary (xgrammar imports torch: ~10 s)


# What runs in the worker: set up once by `_init_worker`, then `_check_in_worker` per spec.
_WORKER: dict[str, Any] = {}


def _status_bytes(field: str) -> int | None:
    """A ``VmSize``/``VmPeak``-style line of /proc/self/status, in bytes (Linux only)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _init_worker(backend: str, tokenizer_path: str | None, budget: int) -> None:
    import resource

    from serving.launcher import exit_with_parent

    exit_with_parent()  # a kill -9 of the server must not leave this worker behind
    _WORKER["check"] = _checker(backend, tokenizer_path)
    size = _status_bytes("VmSize")
    if size is None:  # e.g. macOS: the deadline remains
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (size + budget, size + budget))
        _WORKER["limit"] = size + budget
    except (ValueError, OSError):
        pass


def worker_facts() -> dict[str, Any]:
    """The worker's own account (for tests and diagnosis): its address-space limit and peak,
    and which heavy libraries it imported."""
    import sys

    return {
        "limit": _WORKER.get("limit"),
        "peak": _status_bytes("VmPeak"),
        "size": _status_bytes("VmSize"),
        "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules),
    }


def _checker(backend: str, tokenizer_path: str | None) -> Callable[[str], str | None]:
    if backend == "xgrammar":
        from serving import backend_xgrammar as module
    else:
        from serving import backend_guidance as module  # type: ignore[no-redef]
    return module.make_checker(tokenizer_path)


def _check_in_worker(payload: str) -> str | None:
    try:
        return _WORKER["check"](payload)  # type: ignore[no-any-return]
    except MemoryError:
        return "compiling it exhausted the worker's memory"


class GrammarChecker:
    """Compiles a backend's grammar against the model's vocabulary under a deadline.

    ``process`` (the server): one spawned worker with an address-space limit, killed and
    replaced when a compile overruns; ``thread`` (unit tests): the same check in a thread.
    """

    def __init__(
        self,
        backend: str,
        tokenizer_path: str | None,
        *,
        timeout_s: float = 10.0,
        mode: Literal["process", "thread"] = "process",
    ) -> None:
        self.backend, self.tokenizer_path = backend, tokenizer_path
        self.timeout_s, self.mode = timeout_s, mode
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._local: Callable[[str], str | None] | None = None
        self._local_lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None
        self._ready = False  # the worker (or thread) has loaded the vocabulary

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.backend, self.tokenizer_path, COMPILE_BUDGET),
            )
        return self._pool

    def _thread_check(self, payload: str) -> str | None:
        with self._local_lock:
            if self._local is None:
                self._local = _checker(self.backend, self.tokenizer_path)
        return self._local(payload)

    def warm(self) -> None:
        """Start the worker and load the vocabulary now, not on the first tool request."""
        if self.mode == "process":
            future = self._executor().submit(_check_in_worker, "")
            future.add_done_callback(lambda f: self._mark_ready(f.exception() is None))

    def _mark_ready(self, ok: bool) -> None:
        if not ok:
            logger.warning("the %s constraint checker could not load the vocabulary of %s",
                           self.backend, self.tokenizer_path)  # fmt: skip
        self._ready = self._ready or ok

    async def check(self, payload: str, *, what: str) -> None:
        loop = asyncio.get_running_loop()
        if self._slots is None:
            self._slots = asyncio.Semaphore(1)
        async with self._slots:
            if self.mode == "thread":
                future = loop.run_in_executor(None, self._thread_check, payload)
            else:
                future = asyncio.wrap_future(self._executor().submit(_check_in_worker, payload))
            try:  # the first check also waits for the worker's start (vocabulary load)
                startup = 0.0 if self._ready else STARTUP_S
                error = await asyncio.wait_for(future, timeout=self.timeout_s + startup)
                self._ready = True
            except TimeoutError as exc:
                logger.warning("compiling %s overran %.0f s: refused", what, self.timeout_s)
                self._replace_pool()
                self.warm()  # the next request finds a worker ready
                raise too_complex(what, f"compiling it took over {self.timeout_s:.0f} s") from exc
            except BrokenProcessPool as exc:
                self._replace_pool()
                raise too_complex(what, "compiling it exhausted the worker's memory") from exc
        if error is not None:
            raise InvalidRequest(
                f"{what} cannot be enforced by the {self.backend} backend: {error[:300]}",
                param=what,
                code="invalid_schema",
            )

    def _replace_pool(self) -> None:
        pool, self._pool = self._pool, None
        self._ready = self._ready and self.mode == "thread"
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public kill
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._replace_pool()


def make_backend(
    name: BackendName,
    tokenizer_path: str | None,
    *,
    timeout_s: float = 10.0,
    mode: Literal["process", "thread"] = "process",
) -> ConstraintBackend:
    if name == "outlines":
        return OutlinesBackend()
    checker = GrammarChecker(name, tokenizer_path, timeout_s=timeout_s, mode=mode)
    if name == "xgrammar":
        return XGrammarBackend(checker)
    return GuidanceBackend(checker)
