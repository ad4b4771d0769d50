"""Compiling schemas off the event loop, with a deadline and a memory ceiling.

`compile_schema` is CPU-bound and mostly cheap, but part of it runs inside outlines_core
(Rust), whose regex for nested objects can grow without bound: a 5 KB schema of four levels
of objects with an ``anyOf`` beside their 40 optional properties made it allocate gigabytes
and abort the whole process. So `SchemaCompiler` runs it

* ``"process"`` (the server's default) - in a worker process with an address-space limit
  (`WORKER_MEMORY`): a compile that overruns its deadline or dies takes only the worker
  with it; the worker is replaced and the schema refused (400 ``schema_too_complex``);
* ``"thread"`` - in a worker thread with the same deadline (tests, or platforms without
  ``RLIMIT_AS``): the loop stays free, but a runaway compile keeps its thread.

Concurrency is bounded (`concurrency` compiles at once), so thousands of tools in one request
queue up here rather than on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import resource
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from serving.constraint import CompiledSchema, compile_schema
from serving.exceptions import InvalidRequest
from serving.schema_limits import SchemaLimits
from serving.validation import DEFAULT_DEADLINE_S, SafeValidator

log = logging.getLogger(__name__)

WORKER_MEMORY = 3 << 30
CompileMode = Literal["process", "thread"]
# What crosses the process boundary: ("ok", regex, exact) or ("error", message, param, code).
_Result = tuple[Any, ...]


def _limit_memory() -> None:
    from serving.launcher import exit_with_parent

    exit_with_parent()  # a kill -9 of the server must not leave this worker behind
    try:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    except (ValueError, OSError):  # e.g. macOS: the deadline remains
        log.debug("could not limit the compile worker's memory")


def _compile(schema: Any, what: str, max_counted: int, limits: SchemaLimits) -> _Result:
    try:
        c = compile_schema(schema, what=what, max_counted=max_counted, limits=limits)
    except InvalidRequest as exc:
        return ("error", exc.message, exc.param, exc.code)
    except (MemoryError, RecursionError) as exc:
        return ("error", f"{what} is too complex to enforce ({type(exc).__name__})", what,
                "schema_too_complex")  # fmt: skip
    return ("ok", c.regex, c.exact)


class SchemaCompiler:
    """Runs `compile_schema` in a worker (process or thread) under a deadline."""

    def __init__(
        self,
        *,
        mode: CompileMode = "thread",
        timeout_s: float = 10.0,
        concurrency: int = 2,
        limits: SchemaLimits | None = None,
        validation_deadline_s: float = DEFAULT_DEADLINE_S,
    ):
        self.validation_deadline_s = validation_deadline_s
        self.mode = mode
        self.timeout_s = timeout_s
        self.limits = limits or SchemaLimits()
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.Executor | None:
        if self.mode == "thread":
            return None  # the loop's default thread pool
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self._concurrency,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_limit_memory,
            )
        return self._pool

    def _replace_pool(self) -> None:
        """Kill the workers (one is stuck or dead) and start afresh on the next compile."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public kill
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    async def compile(
        self, schema: Any, *, what: str = "schema", max_counted: int
    ) -> CompiledSchema:
        loop = asyncio.get_running_loop()
        async with self._slots:
            future = loop.run_in_executor(
                self._executor(), _compile, schema, what, max_counted, self.limits
            )
            try:
                result = await asyncio.wait_for(future, timeout=self.timeout_s)
            except TimeoutError as exc:
                log.warning("compiling %s overran %.0f s: refused", what, self.timeout_s)
                if self.mode == "process":
                    self._replace_pool()
                raise too_complex(what, f"compiling it took over {self.timeout_s:.0f} s") from exc
            except BrokenProcessPool as exc:
                log.warning("the compile worker died on %s (memory?): refused", what)
                self._replace_pool()
                raise too_complex(what, "compiling it exhausted the worker's memory") from exc
        if result[0] == "error":
            raise InvalidRequest(result[1], param=result[2], code=result[3])
        validator = SafeValidator(schema, deadline_s=self.validation_deadline_s)
        return CompiledSchema(schema, result[1], result[2], validator)

    def close(self) -> None:
        self._replace_pool()


def too_complex(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{what} is too complex to enforce: {why}. Flatten nested objects or split the tool.",
        param=what,
        code="schema_too_complex",
    )
