"""A bounded cache of compiled schemas: agents send the same tools on every turn.

A schema is compiled to a regex once, and its automaton measured once (`AutomatonProbe`,
when one is given; a second time with less counted repetition if the first is too big);
refusals are cached too, so a client repeating a too-complex schema gets its 400 at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from serving.automaton import AutomatonProbe
from serving.compile_worker import SchemaCompiler
from serving.constraint import (
    COUNTED_LIMITS,
    MAX_REGEX_CHARS,
    CompiledSchema,
    check_json_schema,
)
from serving.exceptions import InvalidRequest
from serving.metrics import Metrics
from serving.schema_limits import check_schema_limits
from serving.validation import SafeValidator

# Exactness is not worth any compile time: past this many states (~12 s of vLLM compilation
# on one core of the project's machine) the cheaper, validated form is used.
PREFERRED_STATES = 4_000


class SchemaCache:
    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        probe: AutomatonProbe | None = None,
        compiler: SchemaCompiler | None = None,
        size: int = 512,
    ):
        self._items: OrderedDict[str, CompiledSchema | InvalidRequest | int] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._metrics = metrics
        self._probe = probe
        self._compiler = compiler or SchemaCompiler()

    def _lookup(self, key: str, what: str) -> CompiledSchema | int | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message.replace(hit.param or "", what, 1), param=what,
                                 code=hit.code)  # fmt: skip
        return hit

    async def get(self, schema: Any, *, what: str = "schema") -> CompiledSchema:
        # Size, depth and satisfiability first: cheap, iterative, before json.dumps recurses.
        check_schema_limits(schema, what=what, limits=self._compiler.limits)
        key = json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
        hit = self._lookup(key, what)
        if isinstance(hit, CompiledSchema):
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

    async def checked(
        self, schema: Any, *, what: str = "schema", exact: Callable[[Any], bool] | None = None
    ) -> CompiledSchema:
        """A schema checked (limits, JSON Schema itself) for validation only, no regex: the
        grammar backends compile whole turns (`serving.constraint_backend`). `exact` says
        whether the backend enforces it exactly (None: it is not enforced at all)."""
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{what} must be a JSON object", param=what)
        check_schema_limits(schema, what=what, limits=self._compiler.limits)
        key = "checked:" + json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
        hit = self._lookup(key, what)
        if isinstance(hit, CompiledSchema):
            return hit if exact is None or hit.exact == exact(schema) else _with_exact(hit, exact)
        try:
            await asyncio.to_thread(check_json_schema, schema, what)
        except InvalidRequest as exc:
            self._store(key, exc)
            raise
        validator = SafeValidator(schema, deadline_s=self._compiler.validation_deadline_s)
        compiled = CompiledSchema(schema, "", bool(exact and exact(schema)), validator)
        self._store(key, compiled)
        return compiled

    async def _compile(self, schema: Any, what: str) -> CompiledSchema:
        """The most exact regex the probe accepts: counted repetition up to 64 (so that
        ``[0-9a-f]{32}`` stays exact) if that keeps the automaton under `PREFERRED_STATES`,
        else up to 16 (the rest is checked after generation) under the probe's limit."""
        refusal = None
        for i, limit in enumerate(COUNTED_LIMITS):
            last = i == len(COUNTED_LIMITS) - 1
            compiled = await self._compiler.compile(schema, what=what, max_counted=limit)
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

    async def check_regex(self, regex: str, *, what: str) -> int:
        """Admit a client's own regex constraint as a schema's is admitted: bounded text,
        parsed, then its automaton measured by the probe. Returns its state count (0 when
        there is no probe); raises InvalidRequest (400). Verdicts are cached."""
        if not isinstance(regex, str) or not regex:
            raise InvalidRequest(f"{what} must be a non-empty string", param=what)
        if len(regex) > MAX_REGEX_CHARS:
            raise InvalidRequest(
                f"{what} is too long ({len(regex):,} characters, limit {MAX_REGEX_CHARS:,})",
                param=what,
                code="schema_too_complex",
            )
        key = "regex:" + regex
        hit = self._lookup(key, what)
        if isinstance(hit, int):
            return hit
        try:
            states = await self._measure_regex(regex, what)
        except InvalidRequest as exc:
            self._store(key, exc)
            raise
        self._store(key, states)
        return states

    async def _measure_regex(self, regex: str, what: str) -> int:
        try:  # vLLM parses it with Python's `re` first (linear in the text; off the loop)
            await asyncio.to_thread(re.compile, regex)
        except (re.error, RecursionError, OverflowError, ValueError) as exc:
            raise InvalidRequest(f"{what} is not a valid regex: {exc}", param=what) from exc
        if self._probe is None:
            return 0
        return await self._probe.check(regex, what=what)

    def close(self) -> None:
        self._compiler.close()

    def _store(self, key: str, value: CompiledSchema | InvalidRequest | int) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)


def _with_exact(hit: CompiledSchema, exact: Callable[[Any], bool]) -> CompiledSchema:
    return CompiledSchema(hit.schema, hit.regex, exact(hit.schema), hit.validator)
