"""Run the golden task set through the CLI contract, as a user would:

    loopstack bench golden run --base-url http://127.0.0.1:8000/v1 [--fast] [--tasks a,b]

Each task runs ``python -m loopstack agent run GOAL --tools FILE --json ...`` in a subprocess
with its own work directory ($GOLDEN_WORKDIR) and a shared $LOOPSTACK_HOME (memory, traces);
tasks with earlier sessions run those first with the same --user. Prints a markdown table and
writes ``results.json`` + ``results.md`` under --out (default bench/results/golden-<time>).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.golden import checks as c
from loopstack.bench.golden.practice import practice_tasks
from loopstack.bench.golden.tasks import HERE, Task, all_tasks
from loopstack.bench.golden.tasks_multi import multi_tasks, team_zh_tasks
from loopstack.bench.golden.tasks_service import service_tasks

ROOT = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_S = float(os.environ.get("GOLDEN_RUN_TIMEOUT_S", "900"))  # per CLI session


@dataclass
class TaskResult:
    """One task's run as recorded: enough to re-check it later with `--recheck`."""

    id: str
    category: str
    fast: bool
    passed: bool
    reasons: list[str]
    status: str
    reason: str  # the CLI's own word for why the run ended (done, max_steps, model_error...)
    answered_by: str  # "model": it answered on its own; "host": the host forced the answer
    steps: int
    prompt_tokens: int
    completion_tokens: int
    model_calls: int
    tool_calls: int
    tool_errors: int
    elapsed_s: float
    answer: str  # in full
    trace_path: str
    sessions: int = 1
    calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments, status, result
    started_at: float = 0.0
    finished_at: float = 0.0
    out: dict[str, Any] | None = None  # the CLI's JSON line
    earlier: list[dict[str, Any] | None] = field(default_factory=list)  # setup sessions' lines
    returncode: int = 0
    repairs: list[str] = field(default_factory=list)  # what the host corrected in the answer
    cost: dict[str, Any] | None = None  # the CLI's cost of the checked session (whole team)
    arms: dict[str, str] = field(default_factory=dict)  # the answer asked other ways (shadow)
    arm_passed: dict[str, bool] = field(default_factory=dict)  # each judged like the answer
    passed_as_shown: bool = False  # judged with the results the host appended, too


def golden_tasks() -> list[Task]:
    """The golden set: the single-agent tasks and the customer-service agent's."""
    return [*all_tasks(), *service_tasks()]


# The task sets `--set` names (service's ten tasks are part of golden too).
SETS: dict[str, Callable[[], Sequence[Task]]] = {
    "golden": golden_tasks,
    "practice": practice_tasks,
    "multi": multi_tasks,
    "service": service_tasks,
    "team_zh": team_zh_tasks,
}


def parse_last_json(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def trace_lines(path: str) -> list[dict[str, Any]]:
    if not path or not Path(path).is_file():
        return []
    lines = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            lines.append(event)
    return lines


def trace_stats(path: str) -> dict[str, int]:
    """Tokens, model requests and tool errors from a run's JSONL trace (``type`` model,
    final, tool lines); the forced final answer counts as a model request."""
    stats = {"prompt_tokens": 0, "completion_tokens": 0, "tool_errors": 0, "model_calls": 0}
    for event in trace_lines(path):
        kind = event.get("type")
        if kind == "model" or (kind == "final" and event.get("forced")):
            stats["model_calls"] += bool(event.get("prompt_tokens") or kind == "model")
            stats["prompt_tokens"] += int(event.get("prompt_tokens") or 0)
            stats["completion_tokens"] += int(event.get("completion_tokens") or 0)
        elif kind == "tool" and event.get("status") == "error":
            stats["tool_errors"] += 1
    return stats


def tool_results(path: str) -> list[dict[str, Any]]:
    """The calls the host ran (a refused repeat is not one), with each result's status and
    summary, from the trace."""
    keep = ("name", "arguments", "status", "result_summary", "error_type", "step")
    return [
        {k: e.get(k) for k in keep if k in e}
        for e in trace_lines(path)
        if e.get("type") == "tool" and e.get("error_type") != "repeated_call"
    ]


def command(task: Task, goal: str, base_url: str, user: str) -> list[str]:
    cmd = [sys.executable, "-m", "loopstack", "agent", "run", goal]
    if task.tools:  # a team task's coordinator may have no tools of its own
        cmd += ["--tools", str(task.tools_path)]
    for extra in getattr(task, "more_tools", ()):  # tasks_multi: more tools files, a team
        cmd += ["--tools", str(HERE / extra)]
    if getattr(task, "team", ""):
        cmd += ["--team", str(HERE / task.team)]  # type: ignore[attr-defined]
    cmd += list(getattr(task, "args", ()))  # tasks_service: --approve, --mcp-env
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


async def seed_memory(task: Task, user: str, env: dict[str, str]) -> None:
    """Seed the user's memory in the runs' $LOOPSTACK_HOME (examples.customer_service.seed)."""
    cmd = [sys.executable, "-m", "examples.customer_service.seed", "--user", user]
    rc, _, err = await run_cli([*cmd, "--lang", task.seed], env, 300)  # type: ignore[attr-defined]
    if rc != 0:
        raise RuntimeError(f"seeding memory for {task.id} failed: {err[-500:]}")


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
    if getattr(task, "seed", ""):  # tasks_service: the customer's memory, via the memory API
        await seed_memory(task, user, env)
    for goal in task.setup:
        rc, out, err = await run_cli(command(task, goal, base_url, user), env, RUN_TIMEOUT_S)
        earlier.append(c.Outcome(parse_last_json(out), rc, err, workdir, task.max_steps))
    last_began = time.time()
    rc, out, err = await run_cli(command(task, task.goal, base_url, user), env, RUN_TIMEOUT_S)
    (workdir / "stdout.txt").write_text(out)
    (workdir / "stderr.txt").write_text(err)
    parsed = parse_last_json(out)
    trace = str((parsed or {}).get("trace_path") or "")
    result = TaskResult(
        id=task.id,
        category=task.category,
        fast=task.fast,
        passed=False,
        reasons=[],
        status="(none)",
        reason="",
        answered_by="",
        steps=0,
        prompt_tokens=0,
        completion_tokens=0,
        model_calls=0,
        tool_calls=0,
        tool_errors=0,
        elapsed_s=round(time.monotonic() - started, 1),
        answer="",
        trace_path=trace,
        sessions=1 + len(earlier),
        calls=tool_results(trace),
        repairs=[
            p
            for e in trace_lines(trace)
            if e.get("type") == "final"
            for p in e.get("repairs") or []
        ],
        arms=next(
            (e.get("arms") or {} for e in trace_lines(trace) if e.get("type") == "final"), {}
        ),
        started_at=last_began,
        finished_at=time.time(),
        out=parsed,
        earlier=[e.out for e in earlier],
        returncode=rc,
    )
    for o in earlier:
        for key, value in trace_stats(str((o.out or {}).get("trace_path") or "")).items():
            setattr(result, key, getattr(result, key) + value)
    for key, value in trace_stats(trace).items():
        setattr(result, key, getattr(result, key) + value)
    result.cost = (parsed or {}).get("cost")
    return result, check(task, result, workdir, stderr=err)


def own_words(answer: str) -> str:
    """The answer without the tool results the host appended to it
    (`loopstack.agent.run.grounding`)."""
    cut = answer.rfind(" (From ")
    return answer[:cut] if cut > 0 and answer.endswith(")") else answer


def check(task: Task, r: TaskResult, workdir: Path, stderr: str = "") -> c.Outcome:
    """Judge a recorded result with the task's checker (now, or again with `--recheck`) and
    fill in what the record derives from the CLI's line."""
    earlier = [c.Outcome(e, 0, "", workdir, task.max_steps) for e in r.earlier]
    o = c.Outcome(
        r.out,
        r.returncode,
        stderr,
        workdir,
        task.max_steps,
        r.elapsed_s,
        earlier,
        started_at=r.started_at,
        finished_at=r.finished_at,
        tool_results=r.calls,
    )
    # The model's own words are judged: results the host appended to an answer that named
    # none of them ("No review is scheduled. (From read_inbox: ...Thursday 10:00...)") show
    # the user the data, but do not make the model's claim right.
    judged = dataclasses.replace(o, out={**(o.out or {}), "answer": own_words(o.answer)})
    r.reasons = c.contract(judged) + (task.check(judged) if o.out is not None else [])
    if o.status == "error":  # a best-effort answer after the endpoint failed solves nothing
        r.reasons.append(f"the run ended in error: {o.answer[:120]!r}")
    r.passed = not r.reasons
    r.passed_as_shown = o.out is not None and not (c.contract(o) + task.check(o))
    for arm, text in r.arms.items():  # the same run, judged with the arm's answer instead
        alt = dataclasses.replace(o, out={**(o.out or {}), "answer": own_words(text)})
        r.arm_passed[arm] = not (c.contract(alt) + task.check(alt))
    r.status = o.status or "(none)"
    r.reason = str((o.out or {}).get("reason") or "")
    r.answered_by = "model" if r.reason == "answer" else "host"
    r.steps = int((o.out or {}).get("steps") or 0)
    r.tool_calls = len(o.tool_calls)
    r.answer = o.answer
    return o


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
        "answered_by_model": sum(r.answered_by == "model" for r in results),
        "answered_by_host": sum(r.answered_by == "host" for r in results),
        "passed_by_model": sum(r.passed and r.answered_by == "model" for r in results),
        "passed_by_host": sum(r.passed and r.answered_by == "host" for r in results),
        "repaired": sum(bool(r.repairs) for r in results),
        "passed_as_shown": sum(r.passed_as_shown for r in results),
        "arms": {
            arm: sum(r.arm_passed.get(arm, False) for r in results)
            for arm in sorted({a for r in results for a in r.arm_passed})
        },
        "passed_repaired": sum(r.passed and bool(r.repairs) for r in results),
        "mean_steps": round(sum(r.steps for r in results) / n, 2),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "model_calls": sum(r.model_calls for r in results),
        "tool_calls": sum(r.tool_calls for r in results),
        "tool_errors": sum(r.tool_errors for r in results),
        "statuses": dict(Counter(r.status for r in results)),
        "reasons": dict(Counter(r.reason for r in results)),
        "by_category": {k: f"{v[0]}/{v[1]}" for k, v in sorted(by_category.items())},
        "failure_causes": dict(causes.most_common()),
        "wall_s": round(max((r.elapsed_s for r in results), default=0.0), 1),
        "plan": os.environ.get("LOOPSTACK_AGENT_PLAN", "never"),
        "cost_per_task": cost_per_task(results),
        "cache_hit_rate": cache_hit_rate(results),
    }


def cache_hit_rate(results: list[TaskResult]) -> float | None:
    """Cached prompt tokens over prompt tokens, summed over the checked sessions' cost."""
    costs = [r.cost for r in results if r.cost]
    prompt = sum(float(c.get("prompt_tokens") or 0) for c in costs)
    cached = sum(float(c.get("cached_prompt_tokens") or 0) for c in costs)
    return round(cached / prompt, 3) if prompt else None


def cost_per_task(results: list[TaskResult]) -> dict[str, float] | None:
    """Mean of the CLI's ``cost`` (summed over a team's workers) over the checked sessions."""
    costs = [r.cost for r in results if r.cost]
    if not costs:
        return None
    keys = "prompt_tokens cached_prompt_tokens completion_tokens model_calls tool_calls wall_s"
    return {
        k: round(sum(float(x.get(k) or 0) for x in costs) / len(costs), 1) for k in keys.split()
    }


def _calls_text(r: TaskResult) -> str:
    parts = []
    for call in r.calls:
        args = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
        parts.append(f"{call.get('name')}({args}) {call.get('status')}")
    return "; ".join(parts)


def _cell(text: str, limit: int) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markdown(results: list[TaskResult], summary: dict[str, Any]) -> str:
    rows = [
        f"Success: **{summary['passed']}/{summary['tasks']} ({summary['success_rate']:.0%})**; "
        f"answered by the model itself {summary['answered_by_model']} "
        f"({summary['passed_by_model']} passed), forced by the host "
        f"{summary['answered_by_host']} ({summary['passed_by_host']} passed), of which the host "
        f"repaired {summary['repaired']} from the tool results ({summary['passed_repaired']} "
        f"passed); {summary['passed_as_shown']} pass when the results the host appended are "
        f"read too; the same runs answered other ways (shadow arms, passed): {summary['arms']}; "
        f"by category "
        f"{summary['by_category']}; mean steps {summary['mean_steps']}, "
        f"{summary['model_calls']} model requests, tokens {summary['prompt_tokens']} prompt + "
        f"{summary['completion_tokens']} completion (prompt-cache hit "
        f"{summary['cache_hit_rate']}), {summary['tool_calls']} tool calls, "
        f"{summary['tool_errors']} tool errors; statuses {summary['statuses']}.",
        "",
        "| task | category | pass | status (reason) | answered by | steps | tool calls run "
        "| answer | failure | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.id}{' (fast)' if r.fast else ''} | {r.category} | {'yes' if r.passed else 'no'}"
            f" | {r.status} ({r.reason}) | {r.answered_by}{' (repaired)' if r.repairs else ''}"
            f" | {r.steps} | "
            f"{_cell(_calls_text(r), 220)} | {_cell(r.answer, 220)} | "
            f"{_cell('; '.join(r.reasons), 160)} | {r.elapsed_s:.0f} |"
        )
    return "\n".join(rows) + "\n"


def load(path: Path) -> list[TaskResult]:
    """The results recorded in a run's ``results.jsonl`` (the last line per task wins)."""
    by_id: dict[str, TaskResult] = {}
    for line in (path / "results.jsonl").read_text().splitlines():
        if line.strip():
            raw = json.loads(line)
            by_id[raw["id"]] = TaskResult(**raw)
    return list(by_id.values())


def recheck(path: Path) -> list[TaskResult]:
    """Judge a recorded run again with today's checkers (its task folders hold the files and
    side-effect logs the tools left)."""
    os.environ.setdefault("GOLDEN_WORKDIR", str(path / "reference"))
    tasks = {t.id: t for make in SETS.values() for t in make()}
    results = [r for r in load(path) if r.id in tasks]
    for r in results:
        check(tasks[r.id], r, path / "tasks" / r.id)
    return results


def spread(paths: list[Path]) -> str:
    """Several runs side by side: passes per run, per category min-max, per task how often."""
    runs = [{r.id: r for r in load(p)} for p in paths]
    ids = sorted(set().union(*runs), key=lambda i: next(r[i].category for r in runs if i in r))
    cats: dict[str, list[int]] = {}
    for run in runs:
        counts = Counter(r.category for r in run.values() if r.passed)
        for cat in {r.category for r in run.values()}:
            cats.setdefault(cat, []).append(counts.get(cat, 0))
    totals = [sum(r.passed for r in run.values()) for run in runs]
    arms = sorted({a for run in runs for r in run.values() for a in r.arm_passed})
    per_arm = {a: [sum(r.arm_passed.get(a, False) for r in run.values()) for run in runs]
               for a in arms}  # fmt: skip
    lines = [
        f"runs: {len(runs)}; passed per run {totals} of {[len(r) for r in runs]}; "
        f"min {min(totals)}, max {max(totals)}",
        *[
            f"shadow arm {a}: passed per run {v} (same runs, answer asked that way)"
            for a, v in per_arm.items()
        ],
        "",
        "| category | passed per run |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in sorted(cats.items())],
        "",
        "| task | passed in |",
        "|---|---|",
        *[
            f"| {i} | {sum(bool(run.get(i) and run[i].passed) for run in runs)}/{len(runs)} |"
            for i in ids
        ],
    ]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, results: list[TaskResult], base_url: str) -> str:
    summary = summarize(results)
    report = {"summary": summary, "base_url": base_url, "results": [asdict(r) for r in results]}
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    table = markdown(results, summary)
    (out_dir / "results.md").write_text(table)
    return table


app = benchmark_app(__doc__)


@app.command()
def golden(
    base_url: str = typer.Option(
        "http://127.0.0.1:8000/v1", envvar="LOOPSTACK_BASE_URL", show_envvar=False
    ),
    api_key: str = typer.Option("test-key-123", envvar="LOOPSTACK_API_KEY", show_envvar=False),
    fast: bool = typer.Option(False, "--fast", help="only the fast subset"),
    set_: str = typer.Option("golden", "--set", help=f"the task set: {', '.join(SETS)}"),
    plan: Literal["auto", "always", "never"] | None = typer.Option(
        None, help="LOOPSTACK_AGENT_PLAN for every run"
    ),
    tasks: str = typer.Option("", help="comma-separated task ids"),
    concurrency: int = typer.Option(4),
    out: Path | None = typer.Option(None),
    recheck: Path | None = typer.Option(None, help="judge a recorded run again; no model calls"),
    spread: list[Path] | None = typer.Option(None, help="compare several recorded runs"),
) -> int:
    return _command(SimpleNamespace(**locals()))


def _command(args: SimpleNamespace) -> int:
    args.set = args.set_
    if args.set not in SETS:
        raise typer.BadParameter(f"--set: one of {', '.join(SETS)}, not {args.set!r}")
    if args.spread:
        print(spread(args.spread))
        return 0
    if args.recheck:
        results = recheck(args.recheck.resolve())
        lines = "".join(json.dumps(asdict(r)) + "\n" for r in results)
        (args.recheck / "results.jsonl").write_text(lines)  # the verdicts of today's checkers
        print(write_report(args.recheck.resolve(), results, "(recheck)"))
        return 0

    out_dir = args.out or ROOT / "bench" / "results" / f"golden-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["GOLDEN_WORKDIR"] = str(out_dir / "reference")  # expected values are computed here
    tasks = list(SETS[args.set]())
    if args.plan:
        os.environ["LOOPSTACK_AGENT_PLAN"] = args.plan  # each CLI run reads it
    if args.fast:
        tasks = [t for t in tasks if t.fast]
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t.id in wanted]
    results = asyncio.run(run_all(tasks, args.base_url, out_dir, args.api_key, args.concurrency))
    print(write_report(out_dir, results, args.base_url))
    print(f"results: {out_dir / 'results.json'}")
    return 0 if results else 1


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
