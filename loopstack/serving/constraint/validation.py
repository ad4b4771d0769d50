"""Validating values against client schemas without letting one pattern stall the server.

jsonschema checks ``pattern`` and ``patternProperties`` with Python's backtracking `re`: a
nested quantifier such as ``^(?!z)(a|aa)*c$`` then takes minutes on a few dozen characters
of model output, on whatever thread runs it. `SafeValidator` swaps those two keywords for
the `regex` module with a hard deadline shared by the whole validation (the module enforces
its ``timeout`` inside the matcher and releases the GIL while it matches), and reads
patterns as ECMA-262 does (JSON Schema's dialect): ``\\d`` and ``\\w`` are ASCII. A pattern
that cannot be checked in time is reported as a validation error, never as a pass.

`ChatService` runs validation in a worker thread (`SafeValidator.errors_off_loop`), so the
event loop stays free even while a deadline runs out.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators

# A whole validation (every pattern in one value) gets this long; ordinary patterns match
# in microseconds, so only a pathological one ever meets it. `regex` checks its timeout
# periodically: a search may overrun it about threefold.
DEFAULT_DEADLINE_S = 0.25
_ECMA_FLAGS = regex.ASCII | regex.VERSION0
_local = threading.local()


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """A JSON Schema pattern compiled for `regex` (raises regex.error if it is not one)."""
    return regex.compile(pattern, _ECMA_FLAGS)


def pattern_search(pattern: str, text: str, *, timeout_s: float) -> bool:
    """Whether `pattern` matches somewhere in `text`; TimeoutError past `timeout_s`."""
    return compile_pattern(pattern).search(text, timeout=timeout_s, concurrent=True) is not None


def _remaining() -> float:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return DEFAULT_DEADLINE_S
    return deadline - time.monotonic()


def _search(validator: Any, pattern: str, text: str) -> bool | None:
    """True/False, or None when the pattern could not be checked (time, or bad pattern)."""
    left = _remaining()
    if left <= 0:
        return None
    try:
        return pattern_search(pattern, text, timeout_s=left)
    except (TimeoutError, regex.error, RecursionError, OverflowError, ValueError):
        return None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = _search(validator, pattern, instance)
    if found is None:
        yield ValidationError(f"{instance[:80]!r} could not be checked against {pattern!r} in time")
    elif not found:
        yield ValidationError(f"{instance[:200]!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, pattern_properties: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            found = _search(validator, pattern, k)
            if found is None:
                yield ValidationError(
                    f"property {k[:80]!r} could not be checked against {pattern!r}"
                )
            elif found:
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


_Extended = validators.extend(
    Draft202012Validator, {"pattern": _pattern, "patternProperties": _pattern_properties}
)


class SafeValidator:
    """Draft 2020-12 validation whose pattern keywords are bounded in time."""

    def __init__(self, schema: dict[str, Any], *, deadline_s: float = DEFAULT_DEADLINE_S):
        self._validator = _Extended(schema)
        self.deadline_s = deadline_s

    def errors(self, value: Any) -> list[str]:
        """Every error message (empty: valid). Bounded by `deadline_s` for patterns."""
        _local.deadline = time.monotonic() + self.deadline_s
        try:
            return [e.message for e in self._validator.iter_errors(value)]
        except RecursionError:
            return ["the value is nested too deeply to be checked"]
        finally:
            _local.deadline = None

    async def errors_off_loop(self, value: Any) -> list[str]:
        """`errors`, in a worker thread: the event loop never runs a pattern."""
        return await asyncio.to_thread(self.errors, value)
