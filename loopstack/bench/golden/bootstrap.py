"""Worked examples from the practice runs the checkers passed (DSPy's BootstrapFewShot idea):

    loopstack bench golden bootstrap /tmp/practice [/tmp/practice2 ...] --out examples.json

Each passed practice task whose answer the model wrote itself (not repaired by the host) becomes
``{question, calls, answer}``: its successful calls with the results the host saw, and the
answer it gave. The agent reads the file with
``LOOPSTACK_AGENT_EXAMPLES`` (`loopstack.agent.examples`). Golden tasks are refused as a source.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.golden.practice import practice_tasks
from loopstack.bench.golden.run import load
from loopstack.bench.golden.tasks import all_tasks


def examples(paths: list[Path]) -> list[dict[str, Any]]:
    goals = {t.id: t.goal for t in practice_tasks()}
    golden = {t.id for t in all_tasks()}
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        for r in load(path):
            if r.id in golden:
                raise ValueError(f"{path}: {r.id} is a golden task, not a practice task")
            ok = [c for c in r.calls if c.get("status") == "ok"]
            # the model's own answers only: one the host repaired demonstrates nothing
            if r.passed and ok and not r.repairs and r.id in goals and r.id not in found:
                calls = [
                    {"name": c["name"], "arguments": c.get("arguments") or {},
                     "result": c.get("result_summary", "")}
                    for c in ok
                ]  # fmt: skip
                found[r.id] = {"question": goals[r.id], "calls": calls, "answer": r.answer}
    return list(found.values())


app = benchmark_app(__doc__)


@app.command()
def bootstrap(
    runs: list[Path] = typer.Argument(..., help="practice result folders"),
    out: Path = typer.Option(..., "--out"),
) -> int:
    args = SimpleNamespace(**locals())
    chosen = examples(args.runs)
    args.out.write_text(json.dumps(chosen, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(chosen)} examples -> {args.out}")
    return 0 if chosen else 1


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
