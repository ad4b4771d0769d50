"""Client schemas as the server holds them, and the one cache of verdicts about them.

Agents send the same tools (and the same answer schema) on every step, so whatever the
server decides about a schema or a constraint is decided once: `SchemaCache` keeps every
verdict - a tool schema checked for validation (`checked`), a turn's grammar compiled by its
backend, a schema's regex and its automaton (outlines) - in one bounded LRU, refusals
included: a client repeating a schema that cannot be enforced gets its 400 at once, naming
where it sent it this time.

`CompiledSchema` is a schema as admitted: the schema, whether the backend enforces it
exactly, its regex (outlines only; empty otherwise) and a validator bounded in time
(`loopstack.serving.constraint.validation`) for the check every output gets before it leaves.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from jsonschema import Draft202012Validator, SchemaError

from loopstack.serving.constraint.schema_limits import SchemaLimits, check_schema_limits
from loopstack.serving.constraint.validation import DEFAULT_DEADLINE_S, SafeValidator
from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.metrics import Metrics

T = TypeVar("T")


@dataclass(frozen=True)
class CompiledSchema:
    """A JSON schema as admitted: its constraining regex (outlines; "" for the grammar
    backends, which take the schema itself), whether the backend enforces it exactly, and a
    validator for the final check."""

    schema: dict[str, Any]
    regex: str
    exact: bool
    validator: SafeValidator = field(compare=False, repr=False)

    def errors(self, value: Any) -> list[str]:
        """jsonschema's messages (empty: valid); patterns bounded in time (`validation`)."""
        return self.validator.errors(value)

    async def errors_off_loop(self, value: Any) -> list[str]:
        return await self.validator.errors_off_loop(value)


def check_json_schema(schema: dict[str, Any], what: str) -> None:
    """InvalidRequest unless `schema` is valid JSON Schema (draft 2020-12)."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidRequest(
            f"{what} is not a valid JSON Schema: {exc.message}", param=what
        ) from exc
    except (RecursionError, OverflowError, ValueError, TypeError) as exc:  # e.g. a{99999999999}
        raise InvalidRequest(
            f"{what} is not a valid JSON Schema: {type(exc).__name__}: {str(exc)[:200]}",
            param=what,
            code="invalid_schema",
        ) from exc


def schema_key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)


class SchemaCache:
    """The one verdict cache: key -> what was decided (or the refusal), bounded, LRU."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        limits: SchemaLimits | None = None,
        validation_deadline_s: float = DEFAULT_DEADLINE_S,
        size: int = 512,
    ) -> None:
        self.limits = limits or SchemaLimits()
        self.validation_deadline_s = validation_deadline_s
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._metrics = metrics

    async def verdict(
        self, key: str, what: str, make: Callable[[], Awaitable[T]], *, timed: bool = False
    ) -> T:
        """What `make()` decides for `key`, decided once. A refusal (InvalidRequest) is kept
        too and raised again, naming `what` where it named the first request's place.
        `timed`: the decision is a compile, measured in ``loopstack_schema_compile_seconds``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message.replace(hit.param or "", what, 1), param=what,
                                 code=hit.code)  # fmt: skip
        if hit is not None:
            return cast(T, hit)
        started = time.perf_counter()
        try:
            value = await make()
        except InvalidRequest as exc:
            self._store(key, exc)
            raise
        if timed and self._metrics is not None:
            self._metrics.schema_compile_seconds.observe(time.perf_counter() - started)
        self._store(key, value)
        return value

    async def checked(
        self, schema: Any, *, what: str = "schema", exact: Callable[[Any], bool] | None = None
    ) -> CompiledSchema:
        """A schema checked for validation (limits, satisfiability, JSON Schema itself), no
        regex. `exact` says whether the backend enforces it exactly (None: it is not enforced
        at all, as in the unconstrained baseline)."""
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{what} must be a JSON object", param=what)
        check_schema_limits(schema, what=what, limits=self.limits)

        async def check() -> CompiledSchema:
            await asyncio.to_thread(check_json_schema, schema, what)
            validator = SafeValidator(schema, deadline_s=self.validation_deadline_s)
            return CompiledSchema(schema, "", False, validator)

        hit = await self.verdict("checked:" + schema_key(schema), what, check)
        enforced = bool(exact is not None and exact(schema))
        return hit if hit.exact == enforced else _with_exact(hit, enforced)

    def _store(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def _with_exact(hit: CompiledSchema, exact: bool) -> CompiledSchema:
    return CompiledSchema(hit.schema, hit.regex, exact, hit.validator)
