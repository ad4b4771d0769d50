"""Event-loop safety: how long the loop stalls while hostile input is handled, before/after.

Three hostile inputs from the reliability issue, each measured as the event loop's largest
lag (a 5 ms ticker runs beside the work) and the work's own time:

* the call detector over call-like text (``x {"name": `` repeated, 4-character chunks):
  the old rescan-everything detector (kept here as the baseline) vs `IntentDetector`;
* validating a value against a backtracking ``pattern``: jsonschema's default (Python
  `re`, on the loop) vs `SafeValidator` (`regex` with a deadline, in a thread);
* compiling the 5 KB schema whose regex would be 2 billion characters (`SchemaCache` with
  the process worker; the old code took 24 s and 2 GiB on the loop - see docs).

    python -m bench.loop_safety
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import regex
from jsonschema import Draft202012Validator

from serving.compile_worker import SchemaCompiler
from serving.schema_cache import SchemaCache
from serving.toolcalls import IntentDetector
from serving.validation import SafeValidator

PATTERN = "(?=(a|aa)*c)"
_OLD_INTENT = regex.compile(r'<tool_call>|```(?:json)?[ \t]*\n?\s*\{\s*"name"\s*:|\{\s*"name"\s*:')


class RescanDetector:
    """The detector before the fix: every chunk rescans the whole text (the baseline)."""

    def __init__(self) -> None:
        self.text = ""

    def feed(self, delta: str) -> tuple[int, Any]:
        self.text += delta
        for m in _OLD_INTENT.finditer(self.text):
            before = self.text[: m.start()]
            if not m.group().startswith("{") or before.strip() == "" or before.endswith("\n"):
                return m.start(), m
        return len(self.text), None


async def measure(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """(max loop lag s, elapsed s, outcome)."""
    lag, stop = 0.0, False

    async def tick() -> None:
        nonlocal lag
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lag = max(lag, time.perf_counter() - t - 0.005)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    try:
        outcome: Any = await work()
    except Exception as exc:
        outcome = type(exc).__name__
    elapsed = time.perf_counter() - started
    stop = True
    await ticker
    return lag, elapsed, outcome


def scan(detector: Any, text: str) -> Callable[[], Awaitable[int]]:
    async def run() -> int:  # as ChatService does: feed each delta on the loop
        for i in range(0, len(text), 4):
            detector.feed(text[i : i + 4])
        return len(text)

    return run


def defs_chain() -> dict[str, Any]:
    defs: dict[str, Any] = {
        "L3": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    }
    for name, inner in (("L2", "L3"), ("L1", "L2")):
        refs = {f"p{i}": {"$ref": f"#/$defs/{inner}"} for i in range(40)}
        defs[name] = {"type": "object", "properties": refs}
    refs = {f"p{i}": {"$ref": "#/$defs/L1"} for i in range(40)}
    return {"$defs": defs, "type": "object", "properties": refs}


def row(name: str, lag: float, elapsed: float, outcome: Any) -> None:
    print(f"{name:<58} max loop lag {lag * 1e3:9.1f} ms   took {elapsed:7.2f} s   {outcome}")


async def main(baseline_chars: int, chars: int, re_len: int) -> None:
    text = 'x {"name": ' * (chars // 11 + 1)
    row(f"detector, rescanning (before), {baseline_chars:,} chars",
        *await measure(scan(RescanDetector(), text[:baseline_chars])))  # fmt: skip
    row(f"detector, incremental (after), {baseline_chars:,} chars",
        *await measure(scan(IntentDetector(), text[:baseline_chars])))  # fmt: skip
    row(f"detector, incremental (after), {chars:,} chars",
        *await measure(scan(IntentDetector(), text[:chars])))  # fmt: skip

    schema = {"type": "string", "pattern": PATTERN}
    value = "a" * re_len + "b"

    async def python_re() -> int:
        return len(list(Draft202012Validator(schema).iter_errors(value)))

    row(f"pattern {PATTERN} on {re_len + 1} chars, re on loop (before)",
        *await measure(python_re))  # fmt: skip

    async def safe() -> int:
        return len(await SafeValidator(schema).errors_off_loop("a" * 60 + "b"))

    row(f"pattern {PATTERN} on 61 chars, deadline, thread (after)", *await measure(safe))

    cache = SchemaCache(compiler=SchemaCompiler(mode="process"))
    await cache.get({"type": "string"})  # the worker's start-up is not the schema's cost

    async def big() -> Any:
        return await cache.get(defs_chain())

    row("5 KB schema, 2e9-char regex, process worker (after)", *await measure(big))
    cache.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-chars", type=int, default=8_000)
    ap.add_argument("--chars", type=int, default=32_000)
    ap.add_argument("--re-len", type=int, default=28)
    args = ap.parse_args()
    asyncio.run(main(args.baseline_chars, args.chars, args.re_len))
