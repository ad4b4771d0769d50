"""A bounded cache of compiled schemas: agents send the same tools on every turn.

A schema is compiled to a regex once, and its automaton measured once (`AutomatonProbe`,
when one is given; a second time with less counted repetition if the first is too big);
refusals are cached too, so a client repeating a too-complex schema gets its 400 at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any

from serving.automaton import AutomatonProbe
from serving.constraint import COUNTED_LIMITS, CompiledSchema, compile_schema
from serving.exceptions import InvalidRequest
from serving.metrics import Metrics

# Exactness is not worth any compile time: past this many states (~12 s of vLLM compilation
# on one core of the project's machine) the cheaper, validated form is used.
PREFERRED_STATES = 4_000


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
            compiled = await self._compile(schema, what)
        except InvalidRequest as exc:
            self._store(key, exc)
            raise
        if self._metrics is not None:
            self._metrics.schema_compile_seconds.observe(time.perf_counter() - started)
        self._store(key, compiled)
        return compiled

    async def _compile(self, schema: Any, what: str) -> CompiledSchema:
        """The most exact regex the probe accepts: counted repetition up to 64 (so that
        ``[0-9a-f]{32}`` stays exact) if that keeps the automaton under `PREFERRED_STATES`,
        else up to 16 (the rest is checked after generation) under the probe's limit."""
        refusal = None
        for i, limit in enumerate(COUNTED_LIMITS):
            last = i == len(COUNTED_LIMITS) - 1
            compiled = compile_schema(schema, what=what, max_counted=limit)
            if self._probe is None:
                return compiled
            try:
                cap = None if last else PREFERRED_STATES
                await self._probe.check(compiled.regex, what=what, max_states=cap)
                return compiled
            except InvalidRequest as exc:
                refusal = exc
        assert refusal is not None
        raise refusal

    def _store(self, key: str, value: CompiledSchema | InvalidRequest) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
