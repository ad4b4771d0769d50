"""A bounded cache of compiled schemas: agents send the same tools on every turn.

A schema is compiled to a regex once, and its automaton measured once (`AutomatonProbe`,
when one is given); refusals are cached too, so a client repeating a too-complex schema
gets its 400 at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any

from serving.automaton import AutomatonProbe
from serving.constraint import CompiledSchema, compile_schema
from serving.exceptions import InvalidRequest
from serving.metrics import Metrics


class SchemaCache:
    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        probe: AutomatonProbe | None = None,
        size: int = 512,
    ):
        self._items: OrderedDict[str, CompiledSchema | InvalidRequest] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._metrics = metrics
        self._probe = probe

    async def get(self, schema: Any, *, what: str = "schema") -> CompiledSchema:
        key = json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message.replace(hit.param or "", what, 1), param=what,
                                 code=hit.code)  # fmt: skip
        if hit is not None:
            return hit
        started = time.perf_counter()
        try:
            compiled = compile_schema(schema, what=what)
            if self._probe is not None:
                await self._probe.check(compiled.regex, what=what)
        except InvalidRequest as exc:
            self._store(key, exc)
            raise
        if self._metrics is not None:
            self._metrics.schema_compile_seconds.observe(time.perf_counter() - started)
        self._store(key, compiled)
        return compiled

    def _store(self, key: str, value: CompiledSchema | InvalidRequest) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
