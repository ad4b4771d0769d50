"""Redaction on ordinary text: every LoCoMo turn through ``loopstack.memory.redaction.redact``.

    .venv/bin/python -m loopstack.bench.memory.redaction [--data
    loopstack/bench/memory/data/locomo10.zip]

LoCoMo's 10 conversations (5,882 turns of everyday chat, the same ``"Speaker: text"`` records
``loopstack.bench.memory.locomo`` stores) hold no secret: every redaction there is a false positive
(issue #58 found "a spiderman pin on your purse. Is Spider-Man ..." stored as "Is
[REDACTED:password] ..."). Prints the number of turns changed (the goal: 0), each changed
turn with what it became, and the time per turn. The data is not committed (CC BY-NC 4.0):
see loopstack/bench/memory/data/README.md. The secrets corpus that must still be redacted is in
tests/unit/memory/test_memory_redaction.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.memory.locomo import DATA, load_conversations, turns_of
from loopstack.memory.redaction import redact


def locomo_redactions(path: Path = DATA) -> tuple[int, list[tuple[str, str, str]]]:
    """(turns read, [(turn id, text, redacted text)] for every turn redaction changed)."""
    turns = 0
    changed: list[tuple[str, str, str]] = []
    for conv in load_conversations(path):
        for dia, text, _ in turns_of(conv):
            turns += 1
            out, _kinds = redact(text)
            if out != text:
                changed.append((f"{conv['_name']}:{dia}", text, out))
    return turns, changed


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def redaction(
    data: Path = typer.Option(DATA, help="path to locomo10.zip"),
) -> None:
    t0 = time.perf_counter()
    turns, changed = locomo_redactions(data)
    took = time.perf_counter() - t0
    for turn_id, text, out in changed:
        print(f"{turn_id}\n  in:  {text}\n  out: {out}")
    print(f"turns {turns}  redacted {len(changed)}  ({took / max(turns, 1) * 1e6:.0f} us a turn)")
    print("RESULT " + json.dumps({"turns": turns, "redacted": len(changed), "seconds": took}))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
