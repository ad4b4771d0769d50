"""A bounded cache of compiled schemas: agents send the same tools on every turn."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any

from serving.constraint import CompiledSchema, compile_schema
from serving.metrics import Metrics


class SchemaCache:
    def __init__(self, metrics: Metrics | None = None, *, size: int = 512):
        self._items: OrderedDict[str, CompiledSchema] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._metrics = metrics

    def get(self, schema: Any, *, what: str = "schema") -> CompiledSchema:
        key = json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        started = time.perf_counter()
        compiled = compile_schema(schema, what=what)
        if self._metrics is not None:
            self._metrics.schema_compile_seconds.observe(time.perf_counter() - started)
        with self._lock:
            self._items[key] = compiled
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return compiled
