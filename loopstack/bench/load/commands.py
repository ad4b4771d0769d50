"""The capacity commands of ``loopstack bench``: ``plan`` (again from a saved sweep, tested
levels; with ``--fit``/``--holdout`` the replica model, its measured error and the modelled
plan) and ``pauses`` (the prefix-cache hit rate against tool pauses). Registered on the
``bench`` app by `loopstack.bench.cli`; like it, they import the load test's heavier modules only
when run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from loopstack.bench.common import DEFAULT_BASE_URL, api_key_or_env, fmt_num, parse_levels
from loopstack.bench.load import BenchError
from loopstack.bench.load.plan import Plan


def pauses(
    base_url: str = typer.Option(DEFAULT_BASE_URL, help="OpenAI-compatible base URL (…/v1)."),
    api_key: str | None = typer.Option(None, help="API key (default: $LOOPSTACK_API_KEY)."),
    model: str | None = typer.Option(None, help="Model (default: first of /v1/models)."),
    pauses: str = typer.Option("0.1,1,10", help="Tool pauses (s), comma-separated."),
    agents: str = typer.Option("1,4,16", help="Concurrent agents per level."),
    tasks_per_agent: int = typer.Option(1, min=1),
    scenario: Path | None = typer.Option(None, help="Scenario YAML/JSON (default: shipped)."),
    max_level_s: float = typer.Option(600.0),
    out: Path = typer.Option(Path("bench/results/pauses.json"), help="JSON table."),
) -> None:
    """Prefix-cache hit rate, step latency and TTFT against the tool pause, per agent count."""
    from loopstack.bench.common import print_table
    from loopstack.bench.load.pauses import kv_cache_tokens, run_pauses, save_rows, table
    from loopstack.bench.load.scenario import load_scenario
    from loopstack.bench.load.target import TargetConfig

    target = TargetConfig("ours", base_url, api_key_or_env(api_key), model)
    try:
        sc = load_scenario(scenario)
        kv = asyncio.run(kv_cache_tokens(target))
        rows = asyncio.run(
            run_pauses(
                target,
                sc,
                parse_levels(pauses),
                [int(a) for a in parse_levels(agents)],
                tasks_per_agent,
                max_level_s,
            )
        )
    except BenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    save_rows(rows, kv, out)
    head, body = table(rows)
    print_table(head, body)
    typer.echo(f"KV cache: {kv if kv is not None else 'not reported'} tokens; wrote {out}")


def plan(
    result_json: Path | None = typer.Argument(
        None, exists=True, help="result.json of an agents run (not with --hardware)."
    ),
    agents: int = typer.Option(..., min=1, help="N: agents to serve."),
    slo_p95_step_s: float | None = typer.Option(None, help="SLO: p95 step latency (s)."),
    slo_p95_step: str | None = typer.Option(None, help="The same as a duration: 10s, 2.5s."),
    hardware: str | None = typer.Option(
        None, help="Plan a GPU fleet from the replica model: h100|h200|a100|l40s|b200|..."
    ),
    model_id: str | None = typer.Option(
        None, "--model", help="With --hardware: HF id (shipped config.json) or model folder."
    ),
    tp: int = typer.Option(1, min=1, help="With --hardware: tensor-parallel GPUs a replica."),
    weights_dtype: str = typer.Option("bf16", help="With --hardware: bf16|fp8|..."),
    kv_dtype: str = typer.Option("bf16", help="With --hardware: KV-cache dtype."),
    workload: Path | None = typer.Option(
        None, exists=True, help="With --hardware: workload YAML (agents or requests)."
    ),
    gpu_cost_per_hour: float | None = typer.Option(
        None, min=0, help="With --hardware: price of one GPU-hour (cost per 1,000 tasks)."
    ),
    cliff_plot: Path | None = typer.Option(
        None, help="With --hardware: write the KV-cliff plot (PNG) here."
    ),
    min_goodput: float | None = typer.Option(None, help="Use goodput >= this instead of p95."),
    arm: str = typer.Option("ours", help="Which arm of the result to plan for."),
    replica_cost_per_hour: float | None = typer.Option(
        None, min=0, help="Price of one replica-hour: prints what 1,000 tasks cost."
    ),
    fit: str | None = typer.Option(
        None,
        help="Fit the replica model on these levels (e.g. 1,4,16); default: all but --holdout.",
    ),
    holdout: str | None = typer.Option(
        None, help="Levels the model does not see; their prediction error is reported."
    ),
    slo_p95_task_s: float | None = typer.Option(None, help="SLO on whole tasks: p95 task time."),
    tool_latency: str | None = typer.Option(
        None,
        help="Tool latency for the plan: lognormal:MEDIAN[,SIGMA[,MAX]] | fixed:S | "
        "uniform:LO,HI | replay:TRACE (default: the run's scenario).",
    ),
    context_growth: int | None = typer.Option(
        None, min=0, help="Prompt tokens each step adds (default: as measured)."
    ),
    hit_rate: float | None = typer.Option(
        None, min=0, max=1, help="Prefix-cache token hit rate (default: as measured)."
    ),
    replicas_check: str | None = typer.Option(
        None, help="Predict RxN pairs, e.g. 2x8 (2 replicas, 8 agents)."
    ),
    measured_replicas: str | None = typer.Option(
        None,
        help="result.json of a run against R replicas behind a router, or one per replica "
        "(comma-separated, run side by side, agents pinned): compared with the prediction.",
    ),
    replicas: int = typer.Option(2, min=1, help="Replicas behind --measured-replicas."),
    out: Path | None = typer.Option(None, help="Write the report here (default: no files)."),
) -> None:
    """Recompute the plan from a saved result for another N or SLO (no new load); with
    --fit/--holdout, fit the replica model, check it on the held-out levels and plan with it."""
    from loopstack.bench.load.result import load_result, make_plan

    slo = _slo(slo_p95_step_s, slo_p95_step)
    gpu_lines: list[str] = []
    if hardware:
        from loopstack.bench.load.gpuplan import plan_command

        try:
            gpu_lines = plan_command(
                hardware, model_id, tp, weights_dtype, kv_dtype, workload, agents, slo,
                gpu_cost_per_hour, cliff_plot,
            )  # fmt: skip
        except BenchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        for line in gpu_lines:
            typer.echo(line)
        if result_json is None:
            return
    if result_json is None:
        typer.echo("error: give a result.json, or --hardware to plan a GPU fleet", err=True)
        raise typer.Exit(2)
    try:
        result = load_result(result_json)
    except Exception as exc:
        typer.echo(f"error: cannot read {result_json}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if arm not in result.arms():
        typer.echo(f"error: no arm {arm!r} in {result_json} (has {result.arms()})", err=True)
        raise typer.Exit(2)
    p = make_plan(result, agents, slo, min_goodput, arm, replica_cost_per_hour)
    print_plan(p)
    typer.echo(p.line())
    if fit or holdout:
        from loopstack.bench.load.modelled import ModelPlanOptions, model_plan

        opts = ModelPlanOptions(
            fit=[int(x) for x in parse_levels(fit)] if fit else None,
            holdout=[int(x) for x in parse_levels(holdout)] if holdout else [],
            agents=agents,
            slo_p95_step_s=slo,
            slo_p95_task_s=slo_p95_task_s,
            tool_latency=tool_latency,
            context_growth=context_growth,
            hit_rate=hit_rate,
            replica_checks=replica_pairs(replicas_check),
            arm=arm,
        )
        try:
            paths = [Path(x) for x in measured_replicas.split(",")] if measured_replicas else []
            lines = model_plan(result, opts, paths, replicas)
        except BenchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        for line in lines:
            typer.echo(line)
    result.plan = p
    result.gpu_plan = gpu_lines  # the modelled GPU plan beside the measured one (--hardware)
    if out:
        from loopstack.bench.load.report import write_report

        for path in write_report(result, out):
            typer.echo(f"wrote {path}")


def _slo(seconds: float | None, text: str | None) -> float:
    if text:
        t = text.strip().lower().removesuffix("s")
        try:
            return float(t[:-1]) / 1000 if t.endswith("m") else float(t)
        except ValueError:
            raise typer.BadParameter(f"--slo-p95-step: not a duration: {text!r}") from None
    if seconds is None:
        raise typer.BadParameter("give --slo-p95-step-s (or --slo-p95-step 10s)")
    return seconds


def replica_pairs(spec: str | None) -> list[tuple[int, int]]:
    pairs = []
    for part in (spec or "").split(","):
        if part.strip():
            r, _, n = part.strip().partition("x")
            pairs.append((int(r), int(n)))
    return pairs


def print_plan(p: Plan) -> None:
    typer.echo("plan per level: " + ", ".join(
        f"{x.agents:g} agents p95 {fmt_num(x.p95_step_s)} s goodput {fmt_num(x.goodput)}"
        f"{' OK' if x.meets else ' miss'}" for x in p.points
    ))  # fmt: skip
    typer.echo(f"formula: {p.formula}")
    if p.replicas_by_rate is not None:
        typer.echo(
            f"  C* = {p.per_replica:g} agents; per agent {fmt_num(p.per_agent_calls_per_s, 3)} "
            f"calls/s; one replica {fmt_num(p.replica_calls_per_s, 3)} calls/s at C* -> "
            f"R_rate = {p.replicas_by_rate}"
        )
    typer.echo(f"  {p.cost_line()}")
    for a in p.assumptions:
        typer.echo(f"  assumes: {a}")
    for n in p.notes:
        typer.echo(f"  note: {n}")
