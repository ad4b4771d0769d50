"""Admission control: a bounded number of generations at once, a bounded queue behind them,
and 429 + Retry-After beyond that - instead of an unbounded queue that only grows latency."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from loopstack.serving.exceptions import Overloaded
from loopstack.serving.metrics import Metrics


class Admission:
    def __init__(self, metrics: Metrics, *, max_running: int, max_waiting: int, retry_after_s: int):
        self._sem = asyncio.Semaphore(max_running)
        self._max_waiting = max_waiting
        self._waiting = 0
        self._retry_after_s = retry_after_s
        self._metrics = metrics

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._sem.locked():
            if self._waiting >= self._max_waiting:
                self._metrics.rejected.inc()
                raise Overloaded(
                    "The server is overloaded; retry later.", retry_after_s=self._retry_after_s
                )
        self._waiting += 1
        self._metrics.waiting.set(self._waiting)
        try:
            await self._sem.acquire()
        finally:
            self._waiting -= 1
            self._metrics.waiting.set(self._waiting)
        self._metrics.inflight.inc()
        try:
            yield
        finally:
            self._metrics.inflight.dec()
            self._sem.release()
