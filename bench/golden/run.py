"""Run the golden task set through the CLI contract, as a user would:

    python -m bench.golden.run --base-url http://127.0.0.1:8000/v1 [--fast] [--tasks a,b]

Each task runs ``python -m loopstack agent run GOAL --tools FILE --json ...`` in a subprocess
with its own work directory ($GOLDEN_WORKDIR) and a shared $LOOPSTACK_HOME (memory, traces);
tasks with earlier sessions run those first with the same --user. Prints a markdown table and
writes ``results.json`` + ``results.md`` under --out (default bench/results/golden-<time>).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.golden import checks as c
from bench.golden.tasks import Task, all_tasks

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = float(os.environ.get("GOLDEN_RUN_TIMEOUT_S", "900"))  # per CLI session


@dataclass
class TaskResult:
    id: str
    category: str
    fast: bool
    passed: bool
    reasons: list[str]
    status: str
    reason: str  # the CLI's own word for why the run ended (done, max_steps, model_error...)
    steps: int
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    tool_errors: int
    elapsed_s: float
    answer: str
    trace_path: str
    sessions: int = 1
    calls: list[str] = field(default_factory=list)


def parse_last_json(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def trace_stats(path: str) -> dict[str, int]:
    """Tokens and tool errors from a run's JSONL trace (``type`` model, final, tool lines)."""
    stats = {"prompt_tokens": 0, "completion_tokens": 0, "tool_errors": 0, "model_calls": 0}
    if not path or not Path(path).is_file():
        return stats
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") in ("model", "final"):  # final: the forced-answer request
            stats["model_calls"] += event.get("type") == "model"
            stats["prompt_tokens"] += int(event.get("prompt_tokens") or 0)
            stats["completion_tokens"] += int(event.get("completion_tokens") or 0)
        elif event.get("type") == "tool" and event.get("status") == "error":
            stats["tool_errors"] += 1
    return stats


def command(task: Task, goal: str, base_url: str, user: str) -> list[str]:
    cmd = [sys.executable, "-m", "loopstack", "agent", "run", goal]
    cmd += ["--tools", str(task.tools_path)]
    for server in task.mcp:
        cmd += ["--mcp", server]
    cmd += ["--user", user, "--max-steps", str(task.max_steps), "--base-url", base_url, "--json"]
    if task.tool_timeout_s is not None:
        cmd += ["--tool-timeout", f"{task.tool_timeout_s:g}"]
    return cmd


async def run_cli(cmd: list[str], env: dict[str, str], limit_s: float) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(limit_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return -9, out.decode(errors="replace"), err.decode(errors="replace") + "\n[killed]"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def run_task(
    task: Task, base_url: str, out_dir: Path, api_key: str, tag: str
) -> tuple[TaskResult, c.Outcome]:
    workdir = out_dir / "tasks" / task.id
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GOLDEN_WORKDIR": str(workdir),
        "LOOPSTACK_HOME": str(out_dir / "home"),
        "LOOPSTACK_API_KEY": api_key,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    user = f"golden-{task.id}-{tag}"
    started = time.monotonic()
    earlier: list[c.Outcome] = []
    for goal in task.setup:
        rc, out, err = await run_cli(command(task, goal, base_url, user), env, RUN_TIMEOUT_S)
        earlier.append(c.Outcome(parse_last_json(out), rc, err, workdir, task.max_steps))
    rc, out, err = await run_cli(command(task, task.goal, base_url, user), env, RUN_TIMEOUT_S)
    outcome = c.Outcome(
        parse_last_json(out), rc, err, workdir, task.max_steps, time.monotonic() - started, earlier
    )
    (workdir / "stdout.txt").write_text(out)
    (workdir / "stderr.txt").write_text(err)
    reasons = c.contract(outcome) + (task.check(outcome) if outcome.out is not None else [])
    stats = {"prompt_tokens": 0, "completion_tokens": 0, "tool_errors": 0}
    for o in [*earlier, outcome]:
        for key, value in trace_stats(str((o.out or {}).get("trace_path") or "")).items():
            if key in stats:
                stats[key] += value
    result = TaskResult(
        id=task.id,
        category=task.category,
        fast=task.fast,
        passed=not reasons,
        reasons=reasons,
        status=outcome.status or "(none)",
        reason=str((outcome.out or {}).get("reason") or ""),
        steps=int((outcome.out or {}).get("steps") or 0),
        tool_calls=len(outcome.tool_calls),
        elapsed_s=round(outcome.elapsed_s, 1),
        answer=outcome.answer[:300],
        trace_path=str((outcome.out or {}).get("trace_path") or ""),
        sessions=1 + len(earlier),
        calls=[f"{x.get('name')}:{x.get('status')}" for x in outcome.tool_calls],
        **stats,
    )
    return result, outcome


async def run_all(
    tasks: list[Task], base_url: str, out_dir: Path, api_key: str, concurrency: int
) -> list[TaskResult]:
    gate = asyncio.Semaphore(concurrency)
    tag = uuid.uuid4().hex[:6]

    async def one(task: Task) -> TaskResult:
        async with gate:
            result, _ = await run_task(task, base_url, out_dir, api_key, tag)
            with (out_dir / "results.jsonl").open("a") as fh:  # partial results survive a kill
                fh.write(json.dumps(asdict(result)) + "\n")
            mark = "PASS" if result.passed else "FAIL"
            print(
                f"[{mark}] {task.id} ({result.status}, {result.steps} steps, "
                f"{result.elapsed_s:.0f} s) {'; '.join(result.reasons)[:200]}",
                flush=True,
            )
            return result

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def summarize(results: list[TaskResult]) -> dict[str, Any]:
    n = len(results) or 1
    causes = Counter(r.reasons[0].split(":")[0][:60] for r in results if r.reasons)
    by_category: dict[str, list[int]] = {}
    for r in results:
        by_category.setdefault(r.category, [0, 0])
        by_category[r.category][0] += r.passed
        by_category[r.category][1] += 1
    return {
        "tasks": len(results),
        "passed": sum(r.passed for r in results),
        "success_rate": round(sum(r.passed for r in results) / n, 3),
        "mean_steps": round(sum(r.steps for r in results) / n, 2),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "tool_calls": sum(r.tool_calls for r in results),
        "tool_errors": sum(r.tool_errors for r in results),
        "statuses": dict(Counter(r.status for r in results)),
        "by_category": {k: f"{v[0]}/{v[1]}" for k, v in sorted(by_category.items())},
        "failure_causes": dict(causes.most_common()),
        "wall_s": round(max((r.elapsed_s for r in results), default=0.0), 1),
    }


def markdown(results: list[TaskResult], summary: dict[str, Any]) -> str:
    rows = [
        f"Success: **{summary['passed']}/{summary['tasks']} ({summary['success_rate']:.0%})**, "
        f"mean steps {summary['mean_steps']}, tokens {summary['prompt_tokens']} prompt + "
        f"{summary['completion_tokens']} completion, {summary['tool_calls']} tool calls, "
        f"{summary['tool_errors']} tool errors; statuses {summary['statuses']}.",
        "",
        "| task | category | pass | status | steps | tokens (p+c) | tool calls | tool errors "
        "| s | failure cause |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cause = "; ".join(r.reasons).replace("|", "/").replace("\n", " ")[:140]
        status = f"{r.status} ({r.reason})" if r.reason and r.reason != r.status else r.status
        rows.append(
            f"| {r.id}{' (fast)' if r.fast else ''} | {r.category} | {'yes' if r.passed else 'no'}"
            f" | {status} | {r.steps} | {r.prompt_tokens}+{r.completion_tokens} | "
            f"{r.tool_calls} | {r.tool_errors} | {r.elapsed_s:.0f} | {cause} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--base-url", default=os.environ.get("LOOPSTACK_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    ap.add_argument("--api-key", default=os.environ.get("LOOPSTACK_API_KEY", "test-key-123"))
    ap.add_argument("--fast", action="store_true", help="only the fast subset")
    ap.add_argument("--tasks", default="", help="comma-separated task ids")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    out_dir = args.out or ROOT / "bench" / "results" / f"golden-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["GOLDEN_WORKDIR"] = str(out_dir / "reference")  # expected values are computed here
    tasks = all_tasks()
    if args.fast:
        tasks = [t for t in tasks if t.fast]
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t.id in wanted]
    results = asyncio.run(run_all(tasks, args.base_url, out_dir, args.api_key, args.concurrency))
    summary = summarize(results)
    report = {
        "summary": summary,
        "base_url": args.base_url,
        "results": [asdict(r) for r in results],
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    table = markdown(results, summary)
    (out_dir / "results.md").write_text(table)
    print(table)
    print(f"results: {out_dir / 'results.json'}")
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
