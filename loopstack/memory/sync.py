"""``MemoryStore``: the blocking face of :class:`loopstack.memory.store.AsyncMemoryStore`.

It owns one private event loop running in a daemon thread and forwards every call to the
async store there (``asyncio.run_coroutine_threadsafe``), so there is one implementation
and the wrapper works both from plain scripts and from code that already runs an event
loop (where ``asyncio.run`` would fail). Each method is a one-line forward; the logic,
validation and docs live on the async methods.

Use ``MemoryStore.aio`` to reach the async store behind it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Embedder
from loopstack.memory.llm import ModelClient
from loopstack.memory.records import MemorySource, MemoryType, Recall, Record, Turn, WriteResult
from loopstack.memory.store import AsyncMemoryStore, RecallMode

__all__ = ["MemoryStore"]

T = TypeVar("T")


class _LoopThread:
    """An event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="memory-store-loop", daemon=True
                )
                self._thread.start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None and self._thread is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=5)
                self._loop.close()
            self._loop = self._thread = None


class MemoryStore:
    """Sync wrapper: ``MemoryStore(path)`` works with just a path (MiniLM loads lazily)."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        settings: MemorySettings | None = None,
        model: ModelClient | None = None,
    ) -> None:
        self.aio = AsyncMemoryStore(path, embedder=embedder, settings=settings, model=model)
        self._runner = _LoopThread()

    @property
    def path(self) -> Path:
        return self.aio.path

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def open(self) -> MemoryStore:
        self._run(self.aio.open())
        return self

    def close(self) -> None:
        try:
            self._run(self.aio.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> MemoryStore:
        return self.open()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def add(
        self,
        text: str,
        *,
        user_id: str,
        type: MemoryType | str = MemoryType.FACT,
        source: MemorySource | str = MemorySource.USER_EXPLICIT,
        **kw: Any,
    ) -> str:
        return self._run(self.aio.add(text, user_id=user_id, type=type, source=source, **kw))

    def add_many(self, texts: Sequence[str], *, user_id: str, **kw: Any) -> list[str]:
        return self._run(self.aio.add_many(texts, user_id=user_id, **kw))

    def recall(
        self,
        query: str,
        *,
        user_id: str,
        budget_tokens: int | None = None,
        mode: RecallMode = "hybrid",
        **kw: Any,
    ) -> Recall:
        """``budget_tokens=None`` uses the configured default (``MemorySettings.budget_tokens``,
        ``LOOPSTACK_MEMORY_BUDGET_TOKENS``)."""
        return self._run(
            self.aio.recall(query, user_id=user_id, budget_tokens=budget_tokens, mode=mode, **kw)
        )

    def forget(self, record_id: str, *, user_id: str) -> list[str]:
        return self._run(self.aio.forget(record_id, user_id=user_id))

    def forget_matching(self, text: str, *, user_id: str, **kw: Any) -> list[str]:
        return self._run(self.aio.forget_matching(text, user_id=user_id, **kw))

    def history(self, record_id: str, *, user_id: str) -> list[Record]:
        return self._run(self.aio.history(record_id, user_id=user_id))

    def get(self, record_id: str, *, user_id: str) -> Record:
        return self._run(self.aio.get(record_id, user_id=user_id))

    def verify(self, record_id: str, *, user_id: str, **kw: Any) -> Record:
        return self._run(self.aio.verify(record_id, user_id=user_id, **kw))

    def write_back(self, turn: Turn, *, user_id: str, **kw: Any) -> list[WriteResult]:
        return self._run(self.aio.write_back(turn, user_id=user_id, **kw))

    def decay(self, now: float | None = None) -> dict[str, int]:
        return self._run(self.aio.decay(now))

    def reindex(self, *, reembed: bool = False) -> dict[str, Any]:
        return self._run(self.aio.reindex(reembed=reembed))

    def stats(self) -> dict[str, Any]:
        return self._run(self.aio.stats())

    def list(self, *, user_id: str, **kw: Any) -> list[Record]:
        return self._run(self.aio.list(user_id=user_id, **kw))
