"""Event-loop safety: how long the loop stalls while hostile input is handled, before/after.

Three hostile inputs from the reliability issue, each measured as the event loop's largest
lag (a 5 ms ticker runs beside the work) and the work's own time:

* the call detector over call-like text (``x {"name": `` repeated, 4-character chunks):
  the old rescan-everything detector (kept here as the baseline) vs `CallReader.intent`;
* validating a value against a backtracking ``pattern``: jsonschema's default (Python
  `re`, on the loop) vs `SafeValidator` (`regex` with a deadline, in a thread);
* compiling the 5 KB schema whose regex would be 2 billion characters (the outlines
  backend's `RegexSchemas`, in the sandbox's worker process; the old code took 24 s and
  2 GiB on the loop - see docs).

    loopstack bench serving loop-safety
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import regex
import typer
from jsonschema import Draft202012Validator

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.serving.hostile import BACKTRACKING_PATTERN as PATTERN
from loopstack.bench.serving.hostile import call_like_text, defs_chain, loop_lag
from loopstack.serving.constraint.calltext import CallReader
from loopstack.serving.constraint.regexes import RegexSchemas, SchemaCompiler
from loopstack.serving.constraint.validation import SafeValidator

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


async def scan(detector: Any, text: str) -> int:
    """Feed ``text`` in 4-character deltas on the loop, as ChatService does."""
    for i in range(0, len(text), 4):
        detector.feed(text[i : i + 4])
    return len(text)


def row(name: str, lag: float, elapsed: float, outcome: Any) -> None:
    if isinstance(outcome, Exception):
        outcome = type(outcome).__name__
    print(f"{name:<58} max loop lag {lag * 1e3:9.1f} ms   took {elapsed:7.2f} s   {outcome}")


async def measure_all(baseline_chars: int, chars: int, re_len: int) -> None:
    text = call_like_text(chars)
    row(f"detector, rescanning (before), {baseline_chars:,} chars",
        *await loop_lag(scan(RescanDetector(), text[:baseline_chars])))  # fmt: skip
    row(f"detector, incremental (after), {baseline_chars:,} chars",
        *await loop_lag(scan(CallReader.intent(), text[:baseline_chars])))  # fmt: skip
    row(f"detector, incremental (after), {chars:,} chars",
        *await loop_lag(scan(CallReader.intent(), text[:chars])))  # fmt: skip

    schema = {"type": "string", "pattern": PATTERN}
    value = "a" * re_len + "b"

    async def python_re() -> int:
        return len(list(Draft202012Validator(schema).iter_errors(value)))

    row(f"pattern {PATTERN} on {re_len + 1} chars, re on loop (before)",
        *await loop_lag(python_re()))  # fmt: skip

    async def safe() -> int:
        return len(await SafeValidator(schema).errors_off_loop("a" * 60 + "b"))

    row(f"pattern {PATTERN} on 61 chars, deadline, thread (after)", *await loop_lag(safe()))

    cache = RegexSchemas(compiler=SchemaCompiler(mode="process"))
    await cache.get({"type": "string"})  # the worker's start-up is not the schema's cost

    async def big() -> Any:
        return await cache.get(defs_chain())

    row("5 KB schema, 2e9-char regex, process worker (after)", *await loop_lag(big()))
    cache.close()


app = benchmark_app(__doc__.split("\n")[0])


@app.command()
def loop_safety(
    baseline_chars: int = typer.Option(8_000),
    chars: int = typer.Option(32_000),
    re_len: int = typer.Option(28),
) -> int:
    args = SimpleNamespace(**locals())
    asyncio.run(measure_all(args.baseline_chars, args.chars, args.re_len))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
