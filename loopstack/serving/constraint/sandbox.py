"""The one sandbox every constraint compile runs in: a pool of worker processes, each with a
deadline and a memory ceiling.

vLLM has no timeout on compiling a grammar, a JSON schema or a regex, and the libraries can
run away on a hostile one (outlines_core allocated gigabytes for a 5 KB schema and aborted
the process; a regex automaton can take minutes). So whatever a backend must know about a
constraint before the engine sees it - does the grammar compile with the model's vocabulary
(guidance, xgrammar), what is the schema's regex and how many states has its automaton
(outlines) - is computed in a `CompilePool`:

* ``process`` (the server): ``slots`` spawned workers, each in a pool of its own. A worker
  first runs the pool's ``setup`` once (e.g. loading the model's vocabulary: `startup_s`
  more for the first job), then limits its address space to what it uses plus `budget`
  (measured after setup, so a larger library build or vocabulary does not eat into it). A
  job past its deadline, or one that kills its worker, costs only that worker: it is
  killed and replaced, and the caller gets 400 ``schema_too_complex``.
* ``thread`` (unit tests, platforms without ``RLIMIT_AS``): the same jobs in a thread with
  the same deadline; a runaway job keeps its thread.

A job is a module-level function ``job(state, *args)``, ``state`` being what ``setup``
returned in that worker (None without one). Verdicts are not kept here: callers cache them
(`loopstack.serving.constraint.schemas.SchemaCache`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from loopstack.serving.exceptions import InvalidRequest

logger = logging.getLogger(__name__)

R = TypeVar("R")
PoolMode = Literal["process", "thread"]
# What one job may add to the worker's address space, on top of its libraries and the
# model's vocabulary (measured once they are loaded: the CUDA torch that xgrammar imports on
# a GPU box maps ~3 GiB more than the CPU one). Past it a job fails with MemoryError or its
# worker dies: 400 schema_too_complex either way.
COMPILE_BUDGET = 3 << 30
STARTUP_S = 60.0  # a worker that loads the model's vocabulary (xgrammar imports torch: ~10 s)

# What a worker process holds: set up once by `_init_worker`, read by every job.
_WORKER: dict[str, Any] = {}


def too_complex(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{what} is too complex to enforce: {why}. Flatten nested objects or split the tool.",
        param=what,
        code="schema_too_complex",
    )


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


def _init_worker(
    setup: Callable[..., Any] | None, setup_args: tuple[Any, ...], budget: int
) -> None:
    import resource

    from loopstack.serving.engine.launcher import exit_with_parent

    exit_with_parent()  # a kill -9 of the server must not leave this worker behind
    _WORKER["state"] = setup(*setup_args) if setup is not None else None
    size = _status_bytes("VmSize")
    if size is None:  # e.g. macOS: the deadline remains
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (size + budget, size + budget))
        _WORKER["limit"] = size + budget
    except (ValueError, OSError):
        logger.debug("could not limit the compile worker's memory")


def _run_in_worker(job: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return job(_WORKER.get("state"), *args)


def _noop(state: Any) -> None:
    return None


def worker_facts(state: Any) -> dict[str, Any]:
    """A job: the worker's own account (for tests and diagnosis) - its address-space limit,
    size and peak, and which heavy libraries it imported."""
    import sys

    return {
        "limit": _WORKER.get("limit"),
        "peak": _status_bytes("VmPeak"),
        "size": _status_bytes("VmSize"),
        "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules),
    }


@dataclass
class _Slot:
    """One worker: its own single-process pool, so that killing it touches no other job."""

    executor: concurrent.futures.ProcessPoolExecutor | None = None
    busy: bool = False
    ready: bool = False  # set up (vocabulary loaded) and answering


class CompilePool:
    """Runs constraint jobs in sandboxed workers under a deadline (see the module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        setup: Callable[..., Any] | None = None,
        setup_args: tuple[Any, ...] = (),
        slots: int = 1,
        mode: PoolMode = "process",
        budget: int = COMPILE_BUDGET,
        startup_s: float = 0.0,
    ) -> None:
        self.name, self.mode, self.budget, self.startup_s = name, mode, budget, startup_s
        self._setup, self._setup_args = setup, setup_args
        self._slots = [_Slot() for _ in range(max(1, slots))]
        self._gate: asyncio.Semaphore | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._local: Any = None  # thread mode: the setup's result, made once
        self._local_made = False
        self._local_lock = threading.Lock()

    # -- running a job --------------------------------------------------------------------
    async def run(self, job: Callable[..., R], *args: Any, what: str, timeout_s: float) -> R:
        """`job(state, *args)` in a worker, within `timeout_s` (plus `startup_s` while the
        worker is still starting). Raises InvalidRequest(schema_too_complex) when it overruns,
        exhausts the worker's memory or kills it; whatever else the job raises, as it is."""
        loop = asyncio.get_running_loop()
        async with self._semaphore(loop):
            slot = next(s for s in self._slots if not s.busy)
            slot.busy = True
            try:
                return await self._on(slot, loop, job, args, what=what, timeout_s=timeout_s)
            finally:
                slot.busy = False

    async def _on(
        self,
        slot: _Slot,
        loop: asyncio.AbstractEventLoop,
        job: Callable[..., R],
        args: tuple[Any, ...],
        *,
        what: str,
        timeout_s: float,
    ) -> R:
        if self.mode == "thread":
            future: asyncio.Future[R] = loop.run_in_executor(None, self._in_thread, job, args)
        else:
            submitted = self._executor(slot).submit(_run_in_worker, job, args)
            future = asyncio.wrap_future(submitted)
        startup = 0.0 if slot.ready else self.startup_s
        try:
            result = await asyncio.wait_for(future, timeout=timeout_s + startup)
        except TimeoutError as exc:
            logger.warning("compiling %s overran %.0f s: refused", what, timeout_s)
            self._replace(slot)
            if self._setup is not None:
                self._warm(slot)  # the next request finds a worker ready
            raise too_complex(what, f"compiling it took over {timeout_s:.0f} s") from exc
        except BrokenProcessPool as exc:
            logger.warning("the %s worker died on %s (memory?): refused", self.name, what)
            self._replace(slot)
            raise too_complex(what, "compiling it exhausted the worker's memory") from exc
        except MemoryError as exc:
            raise too_complex(what, "compiling it exhausted the worker's memory") from exc
        slot.ready = True
        return result

    def _semaphore(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        if self._gate is None or self._gate_loop is not loop:  # one per event loop
            self._gate, self._gate_loop = asyncio.Semaphore(len(self._slots)), loop
        return self._gate

    def _in_thread(self, job: Callable[..., R], args: tuple[Any, ...]) -> R:
        with self._local_lock:
            if not self._local_made:
                setup = self._setup
                self._local = setup(*self._setup_args) if setup is not None else None
                self._local_made = True
        return job(self._local, *args)

    # -- the workers ----------------------------------------------------------------------
    def _executor(self, slot: _Slot) -> concurrent.futures.ProcessPoolExecutor:
        if slot.executor is None:
            slot.executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self._setup, self._setup_args, self.budget),
            )
        return slot.executor

    def warm(self) -> None:
        """Start the workers (and run their setup) now, not on the first request."""
        if self.mode == "process":
            for slot in self._slots:
                self._warm(slot)

    def _warm(self, slot: _Slot) -> None:
        future = self._executor(slot).submit(_run_in_worker, _noop, ())

        def done(f: concurrent.futures.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                logger.warning("the %s compile worker could not start: %s", self.name,
                               "cancelled" if f.cancelled() else f.exception())  # fmt: skip
            else:
                slot.ready = True

        future.add_done_callback(done)

    def _replace(self, slot: _Slot) -> None:
        """Kill the slot's worker (stuck or dead); a fresh one starts on its next job."""
        pool, slot.executor = slot.executor, None
        slot.ready = slot.ready and self.mode == "thread"
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public kill
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        for slot in self._slots:
            self._replace(slot)
