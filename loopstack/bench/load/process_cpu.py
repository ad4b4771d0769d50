"""CPU seconds by process of a running server, before and after a load run (#40's profile).

``loopstack bench server cpu snapshot PID... > before.json`` records the CPU time of
each process tree (the server, its vLLM API server, the engine core, the worker if any) by
kind; after the run, ``... snapshot PID... > after.json`` and ``... diff before.json
after.json`` prints what each kind used in between. Processes are told apart by their
command line (vLLM names its engine processes ``VLLM::EngineCore`` and ``VLLM::Worker``).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import typer

from loopstack.bench.commandline import benchmark_app, run_command

__all__ = ["diff", "kind", "snapshot"]


def kind(cmdline: str) -> str:
    """What a process of a loopstack server is, from its command line."""
    for needle, name in (
        ("EngineCore", "engine core"),
        ("VLLM::Worker", "worker"),
        ("api_server", "vllm api server"),
        ("loopstack", "loopstack serve"),
    ):
        if needle in cmdline:
            return name
    return "other"


def snapshot(pids: list[int]) -> dict[str, Any]:
    """Every process under each pid (itself included): its kind and CPU seconds so far."""
    procs = []
    for root_pid in pids:
        try:
            root = psutil.Process(root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            try:
                t = p.cpu_times()
                line = " ".join(p.cmdline()) or p.name()
            except psutil.Error:
                continue
            procs.append(
                {"root": root_pid, "pid": p.pid, "kind": kind(line), "cpu_s": t.user + t.system}
            )
    return {"t": time.time(), "procs": procs}


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[tuple[int, str], float]:
    """CPU seconds each (root pid, kind) used between two snapshots; a process that started
    in between counts from zero."""
    was = {p["pid"]: p["cpu_s"] for p in before["procs"]}
    out: dict[tuple[int, str], float] = defaultdict(float)
    for p in after["procs"]:
        out[(p["root"], p["kind"])] += p["cpu_s"] - was.get(p["pid"], 0.0)
    return dict(out)


app = benchmark_app(__doc__)


@app.command("snapshot", help="print a JSON snapshot of these process trees")
def snapshot_cmd(pids: list[int] = typer.Argument(...)) -> int:
    print(json.dumps(snapshot(pids)))
    return 0


@app.command("diff", help="CPU seconds by process kind between two snapshots")
def diff_cmd(before: Path = typer.Argument(...), after: Path = typer.Argument(...)) -> int:
    a, b = (json.loads(p.read_text()) for p in (before, after))
    print(f"window {b['t'] - a['t']:.0f} s")
    for (root, name), cpu in sorted(diff(a, b).items()):
        print(f"{root:>8} {name:16} {cpu:8.1f} CPU-s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
