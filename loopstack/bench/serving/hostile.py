"""Hostile inputs and the event-loop lag meter, shared by `loopstack.bench.serving.loop_safety` and
the serving safety tests (one copy: the benchmark measures what the tests assert).

* `defs_chain`: a ~5 KB schema of three ``$defs`` levels of 40 optional properties whose
  regex would be ~2 billion characters (it took 24 s and 2 GiB before the size check);
* `BACKTRACKING_PATTERN`: a ``pattern`` that backtracks even in the `regex` module;
* `call_like_text`: text that keeps looking like the start of a tool call and never is one;
* `loop_lag`: the event loop's largest lag (a 5 ms ticker) while some work runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

BACKTRACKING_PATTERN = "(?=(a|aa)*c)"


def defs_chain(extra: dict[str, Any] | None = None, props: int = 40) -> dict[str, Any]:
    """~5 KB: objects of ``props`` optional properties, each level a $def referring to the
    next; ``extra`` keywords go beside every ``properties`` (e.g. an ``anyOf``)."""
    extra = extra or {}
    defs: dict[str, Any] = {
        "L3": {
            "type": "object",
            **extra,
            "properties": {f"p{i}": {"type": "string"} for i in range(props)},
        }
    }
    for name, inner in (("L2", "L3"), ("L1", "L2")):
        defs[name] = {
            "type": "object",
            **extra,
            "properties": {f"p{i}": {"$ref": f"#/$defs/{inner}"} for i in range(props)},
        }
    return {
        "$defs": defs,
        "type": "object",
        **extra,
        "properties": {f"p{i}": {"$ref": "#/$defs/L1"} for i in range(props)},
    }


def call_like_text(chars: int) -> str:
    """``x {"name": `` repeated: every position could open a call, none does."""
    return ('x {"name": ' * (chars // 11 + 1))[:chars]


async def loop_lag(work: Awaitable[Any]) -> tuple[float, float, Any]:
    """Run ``work``: (the event loop's largest lag meanwhile in s, the work's own time in s,
    its result or the exception it raised)."""
    lag, stop = 0.0, False

    async def tick() -> None:
        nonlocal lag
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lag = max(lag, time.perf_counter() - t - 0.005)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)  # the ticker is asleep before the work starts
    started = time.perf_counter()
    try:
        outcome: Any = await work
    except Exception as exc:
        outcome = exc
    elapsed = time.perf_counter() - started
    stop = True
    await ticker
    return lag, elapsed, outcome
