"""``loopstack bench``: every benchmark, one command.

The load test (`loopstack.bench.load`: HTTP to any OpenAI-compatible URL, never imports
serving/agent):

    loopstack bench agents --base-url URL --agents 1,4,16 --tasks-per-agent K --out DIR \\
        [--scenario FILE] [--slo-p95-step-s X] [--baseline-url URL] [--api-key KEY]
    loopstack bench requests --base-url URL --concurrency 4 --num-prompts 16 --out DIR
    loopstack bench plan DIR/result.json --agents N --slo-p95-step-s X [--replica-cost-per-hour P]
        [--fit 1,4,16 --holdout 8,12 --slo-p95-task-s Y --out DIR]   (loopstack.bench.load.commands)
    loopstack bench pauses --pauses 0.1,1,10 --agents 1,4,16
    loopstack bench clients --base-url URL [--runs 5] [--clients a,b] [--baseline-url URL]
        (loopstack.bench.clients: each real agent client on a small task, judged strictly)

``agents`` writes result.json, levels.csv, steps.csv, PNG plots and report.html into DIR;
the last line it prints is a one-line summary with the batching gain and the plan.

Every other benchmark is ``loopstack bench SUBJECT NAME [OPTIONS]`` (`SCRIPTS` below lists
them; ``loopstack bench SUBJECT NAME --help`` shows a benchmark's options):

    loopstack bench serving validity|constraint-cost|constraint-compile|proxy-overhead
    loopstack bench serving soak|loop-safety|turn-requests
    loopstack bench memory latency|isolation|locomo|multilingual|postgres
    loopstack bench corpus build
    loopstack bench agent overhead|selection|bfcl|after-results
    loopstack bench golden run|bootstrap
    loopstack bench server cpu snapshot|diff
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from loopstack.bench.clients.command import clients as clients_cmd
from loopstack.bench.commandline import PROG
from loopstack.bench.common import DEFAULT_BASE_URL, api_key_or_env, parse_levels
from loopstack.bench.common import fmt_num as _x
from loopstack.bench.load import BenchError
from loopstack.bench.load.commands import pauses, plan, print_plan
from loopstack.bench.load.scheduler import Mode

app = typer.Typer(
    help="Benchmarks: the agent load test and capacity plan against any OpenAI-compatible URL;"
    " serving, memory, corpus, agent and golden-set benchmarks as sub-commands."
)
logger = logging.getLogger(__name__)

DEFAULT_URL = DEFAULT_BASE_URL


@app.command()
def agents(
    base_url: str = typer.Option(DEFAULT_URL, help="OpenAI-compatible base URL (…/v1)."),
    agents: str = typer.Option("1,4,16", help="Concurrent agents per level, comma-separated."),
    tasks_per_agent: int = typer.Option(1, min=1, help="Tasks each agent runs per level."),
    out: Path = typer.Option(Path("bench/results/agents"), help="Output directory."),
    scenario: Path | None = typer.Option(None, help="Scenario YAML/JSON (default: shipped)."),
    slo_p95_step_s: float = typer.Option(10.0, help="SLO: p95 step latency (s)."),
    min_goodput: float | None = typer.Option(
        None, help="Alternative SLO: share of steps within --slo-p95-step-s (e.g. 0.95)."
    ),
    baseline_url: str | None = typer.Option(None, help="Second endpoint, run interleaved."),
    baseline_api_key: str | None = typer.Option(None, help="Key for --baseline-url."),
    baseline_model: str | None = typer.Option(None, help="Model at --baseline-url."),
    baseline_lenient_calls: bool = typer.Option(
        False, help="Read calls the baseline writes as text (```json, <tool_call>)."
    ),
    baseline_tool_choice: str | None = typer.Option(
        None, help="tool_choice for the baseline arm (default: the scenario's)."
    ),
    api_key: str | None = typer.Option(None, help="API key (default: $LOOPSTACK_API_KEY)."),
    model: str | None = typer.Option(None, help="Model (default: first of /v1/models)."),
    compare_unconstrained: bool = typer.Option(
        False, help="Also run an arm with extra_body loopstack.constrained=false."
    ),
    tool_choice: str | None = typer.Option(None, help="Override: none|auto|required|named."),
    max_tokens: int | None = typer.Option(None, help="Override the scenario's max_tokens."),
    steps: int | None = typer.Option(None, min=1, help="Override every task's step count."),
    arrival_rates: str | None = typer.Option(
        None, help="Open loop instead: Poisson arrivals in tasks/s, comma-separated."
    ),
    open_tasks: int = typer.Option(8, min=1, help="Open loop: arrivals per level."),
    warmup_s: float = typer.Option(
        0.0, help="Steps starting this early in a level are not counted."
    ),
    max_level_s: float = typer.Option(600.0, help="Time limit per level and arm."),
    saturation_cap_s: float = typer.Option(120.0, help="Stop a level when a step exceeds this."),
    seed: int = typer.Option(0),
    plan_agents: int = typer.Option(100, help="N for the plan: agents to serve."),
    requests: bool = typer.Option(
        False, help="Also run vllm bench serve + the cross-check into the same report."
    ),
    tokenizer: str | None = typer.Option(None, help="For --requests (default: found)."),
    tool_latency: str | None = typer.Option(
        None,
        help="Every tool's latency: fixed:S | uniform:LO,HI | lognormal:MEDIAN[,SIGMA"
        "[,MAX]] | replay:TRACE (default: the scenario's).",
    ),
    holdout: str | None = typer.Option(
        None,
        help="Levels to hold out: fit the replica model on the others, report its "
        "error on these and plan with it (e.g. 8,12).",
    ),
    slo_p95_task_s: float | None = typer.Option(None, help="SLO on whole tasks (p95 s)."),
    prewarm: bool = typer.Option(
        False, help="First, one unmeasured agent runs every task once: every level warm."
    ),
) -> None:
    """Closed-loop (or open-loop) agent load sweep, report and plan."""
    from loopstack.bench.load.report import write_report
    from loopstack.bench.load.result import summary_line
    from loopstack.bench.load.runner import SweepConfig, build_arms, run_sweep
    from loopstack.bench.load.scenario import load_scenario, with_tool_latency
    from loopstack.bench.load.target import TargetConfig

    for choice in (tool_choice, baseline_tool_choice):
        if choice not in (None, "none", "auto", "required", "named"):
            raise typer.BadParameter(f"tool_choice must be none|auto|required|named: {choice}")
    try:
        sc = load_scenario(scenario)
        if tool_latency:
            sc = with_tool_latency(sc, tool_latency)
    except BenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    updates: dict[str, Any] = {
        k: v for k, v in {"tool_choice": tool_choice, "max_tokens": max_tokens}.items() if v
    }
    if steps:
        updates["tasks"] = [t.model_dump() | {"steps": steps} for t in sc.tasks]
    if updates:
        sc = sc.model_validate(sc.model_dump() | updates)
    mode: Mode = "open" if arrival_rates else "closed"
    cfg = SweepConfig(
        levels=parse_levels(arrival_rates or agents),
        mode=mode,
        tasks_per_agent=tasks_per_agent,
        open_tasks=open_tasks,
        warmup_s=warmup_s,
        max_level_s=max_level_s,
        saturation_cap_s=saturation_cap_s,
        seed=seed,
        slo_p95_step_s=slo_p95_step_s,
        min_goodput=min_goodput,
        plan_agents=plan_agents,
        compare_unconstrained=compare_unconstrained,
        prewarm=prewarm,
    )
    if mode == "closed" and any(v != int(v) for v in cfg.levels):
        raise typer.BadParameter("--agents must be whole numbers")
    main = TargetConfig("ours", base_url, api_key_or_env(api_key), model)
    base = (
        TargetConfig(
            "baseline",
            baseline_url,
            baseline_api_key or "EMPTY",
            baseline_model,
            lenient_text_calls=baseline_lenient_calls,
            tool_choice=baseline_tool_choice,
        )
        if baseline_url
        else None
    )
    arms = build_arms(main, base, compare_unconstrained)
    try:
        result = asyncio.run(run_sweep(arms, sc, cfg))
        if requests:
            result.requests = asyncio.run(
                _crosscheck(base_url, api_key_or_env(api_key), model, tokenizer)
            )
    except BenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    model_lines: list[str] = []
    if holdout and mode == "closed":
        from loopstack.bench.load.modelled import ModelPlanOptions, model_plan

        opts = ModelPlanOptions(
            fit=None,
            holdout=[int(x) for x in parse_levels(holdout)],
            agents=plan_agents,
            slo_p95_step_s=slo_p95_step_s,
            slo_p95_task_s=slo_p95_task_s,
        )
        try:
            model_lines = model_plan(result, opts)
        except BenchError as exc:
            model_lines = [f"modelled plan: n/a ({exc})"]
    paths = write_report(result, out)
    _print_levels(result)
    if result.plan:
        print_plan(result.plan)
    for line in model_lines:
        typer.echo(line)
    for p in paths:
        typer.echo(f"wrote {p}")
    typer.echo(summary_line(result))


async def _crosscheck(
    base_url: str,
    api_key: str,
    model: str | None,
    tokenizer: str | None,
    concurrency: int = 4,
    num_prompts: int = 16,
    input_len: int = 128,
    output_len: int = 64,
    repeats: int = 1,
    out: Path | None = None,
    seed: int | None = None,
    retries: int | None = None,
) -> dict[str, Any]:
    from loopstack.bench.load.requests import RequestLoad, crosscheck, find_tokenizer, fresh_seed
    from loopstack.bench.load.target import OpenAITarget, TargetConfig

    tok = tokenizer or find_tokenizer()
    if not tok:
        raise BenchError("no tokenizer: pass --tokenizer (the converted model folder)")
    t = await OpenAITarget(TargetConfig("ours", base_url, api_key, model)).open()
    await t.close()
    load = RequestLoad(
        base_url=base_url,
        api_key=api_key,
        model=t.model,
        tokenizer=tok,
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        seed=fresh_seed() if seed is None else seed,
    )
    return await crosscheck(load, repeats=repeats, log_dir=out, retries=retries)


@app.command("requests")
def requests_cmd(
    base_url: str = typer.Option(DEFAULT_URL, help="OpenAI-compatible base URL (…/v1)."),
    api_key: str | None = typer.Option(None, help="API key (default: $LOOPSTACK_API_KEY)."),
    model: str | None = typer.Option(None),
    tokenizer: str | None = typer.Option(None, help="Tokenizer folder (default: found)."),
    concurrency: int = typer.Option(4, min=1),
    num_prompts: int = typer.Option(16, min=1, help="Per run; a multiple of --concurrency."),
    input_len: int = typer.Option(128, min=8),
    output_len: int = typer.Option(64, min=1),
    repeats: int = typer.Option(
        3, min=1, help="Pairs of runs (vllm, ours), the order alternating pair by pair."
    ),
    seed: int | None = typer.Option(
        None,
        help="Dataset seed of the first run, run k uses seed+k (default: a fresh one, "
        "so no prompt is already in the server's prefix cache).",
    ),
    retries: int | None = typer.Option(
        None,
        min=0,
        help="Extra pairs when the engine served another client during a pair "
        "(not compared; default: --repeats).",
    ),
    out: Path = typer.Option(Path("bench/results/requests")),
) -> None:
    """vllm bench serve against the endpoint, cross-checked with our harness."""
    from loopstack.bench.load.report import write_report
    from loopstack.bench.load.result import RunResult

    out.mkdir(parents=True, exist_ok=True)
    try:
        req = asyncio.run(
            _crosscheck(
                base_url, api_key_or_env(api_key), model, tokenizer, concurrency, num_prompts,
                input_len, output_len, repeats, out, seed, retries,
            )
        )  # fmt: skip
    except BenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    import datetime as dt

    result = RunResult(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        mode="requests",
        config={"base_url": base_url},
        scenario={"name": "crosscheck-single-step"},
        targets=[{"name": "ours", "base_url": base_url, "model": model, "extra_body": {}}],
        requests=req,
    )
    for p in write_report(result, out):
        typer.echo(f"wrote {p}")
    for line in crosscheck_lines(req):
        typer.echo(line)


_LABELS = {
    "ttft_median_s": "TTFT median",
    "ttft_mean_s": "TTFT mean",
    "output_tok_s": "output tok/s",
}


def crosscheck_lines(req: dict[str, Any]) -> list[str]:
    """The runs one per line (with what the engine served meanwhile), then ours / vLLM per
    metric over the clean pairs: each pair, min, max, pooled, and both harnesses'
    run-to-run spread; the last line is the verdict."""
    from loopstack.bench.load.requests import METRICS

    lines = []
    for r in req["runs"]:
        f, eng = r["figures"], r.get("engine") or {}
        mark = "" if r.get("pair_clean") is not False else "  (pair not compared: see engine)"
        gap = (
            1e3 * (f["ttft_mean_s"] - eng["ttft_s"])
            if f.get("ttft_mean_s") is not None and eng.get("ttft_s") is not None
            else None
        )
        lines.append(
            f"run {r['pair']} {r['harness']:<4} seed {r['seed']}: TTFT median "
            f"{_x(f['ttft_median_s'], 3)} s, mean {_x(f['ttft_mean_s'], 3)} s, output "
            f"{_x(f['output_tok_s'])} tok/s | engine: requests {_x(r.get('engine_requests'), 0)}"
            f", in flight before/after {r.get('engine_in_flight', '-')}, TTFT mean "
            f"{_x(eng.get('ttft_s'), 3)} s (client {_x(gap, 0)} ms later), decode "
            f"{_x(eng.get('decode_s'))} s/request, prefix-cache hits "
            f"{_x(r.get('prefix_cache_hit_rate'))}{mark}"
        )
    c = req["comparison"]
    for m in METRICS:
        pairs = " ".join(_x(v, 3) for v in c[f"{m}_ratios"])
        lines.append(
            f"ours/vllm {_LABELS[m]:<12}: pairs {pairs}  min {_x(c[f'{m}_ratio_min'], 3)} "
            f"max {_x(c[f'{m}_ratio_max'], 3)} pooled {_x(c[f'{m}_ratio_pooled'], 3)}  "
            f"(run-to-run max/min: vllm {_x(c[f'{m}_vllm_spread'], 3)}, "
            f"ours {_x(c[f'{m}_ours_spread'], 3)})"
        )
    verdict = "within 10 %" if c["within_10pct"] else "NOT within 10 %"
    lines.append(
        f"CROSSCHECK ours/vllm, {c['pairs']} clean pair(s) of {c['pairs_run']} run: "
        f"{verdict} in every pair on TTFT median, TTFT mean and output tok/s (pooled: "
        f"{'within' if c['within_10pct_pooled'] else 'NOT within'} 10 %)"
    )
    return lines


def _print_levels(result: object) -> None:
    from loopstack.bench.common import print_table
    from loopstack.bench.load.result import RunResult

    assert isinstance(result, RunResult)
    rows = []
    for lv in result.levels:
        s = lv.summary
        rows.append(
            [s.arm, f"{s.level:g}", s.steps, s.cold_steps, _x(s.step_latency.p50),
             _x(s.step_latency.p95), _x(s.ttft.p50), _x(s.cold_step_latency.p50),
             _x(s.steps_per_s, 3), _x(s.output_tok_s), _x(s.goodput), s.errors, s.http_429,
             _x(s.cache.hit_rate), _x(s.model_calls_per_task), _x(s.prompt_tokens_per_task, 0),
             _x(s.completion_tokens_per_task, 0), "yes" if s.saturated else ""]
        )  # fmt: skip
    print_table(
        ["arm", "level", "steps", "cold", "p50 s", "p95 s", "TTFT p50", "cold p50", "steps/s",
         "tok/s", "goodput", "err", "429", "cache hit", "calls/task", "prompt tok/task",
         "compl tok/task", "saturated"],
        rows,
    )  # fmt: skip
    for c in result.comparisons:
        typer.echo(
            f"{c.what} at {c.level:g}: {c.num}/{c.den} step p50 {_x(c.step_p50_ratio, 3)}, "
            f"TTFT p50 {_x(c.ttft_p50_ratio, 3)}, steps/s {_x(c.steps_per_s_ratio, 3)}"
        )
    for n in result.notes:
        typer.echo(f"note: {n}")


# the capacity commands live in loopstack.bench.load.commands
app.command()(plan)
app.command()(pauses)
# the client-task bench lives in loopstack.bench.clients.command
app.command("clients")(clients_cmd)


# --- every other benchmark: `loopstack bench SUBJECT NAME [OPTIONS]` ---------------------
# Each module keeps its own typer app (its options, its --help) behind ``main(argv)``
# (`loopstack.bench.commandline`); the command hands it the rest of the line. A module is imported
# only when its command runs, so the load test's commands above never load serving/, agent/ or
# memory/.

SCRIPTS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "serving": ("The serving layer: validity, constraint cost, overhead, soak, loop safety.", {
        "validity": ("loopstack.bench.serving.tool_validity",
                     "Tool-call validity over the corpus, constrained vs unconstrained."),
        "constraint-cost": ("loopstack.bench.serving.constraint_cost",
                            "Decode tok/s and TTFT, constrained / unconstrained, interleaved."),
        "constraint-compile": ("loopstack.bench.serving.constraint_compile",
                               "What our constraints cost the engine to compile (no server)."),
        "proxy-overhead": ("loopstack.bench.serving.proxy_overhead",
                           "Our endpoint vs raw vLLM on the same engine."),
        "soak": ("loopstack.bench.serving.soak",
                 "Many streams, vanishing clients, overload; everything given back after."),
        "loop-safety": ("loopstack.bench.serving.loop_safety",
                        "Event-loop lag while hostile input is handled (no server)."),
        "turn-requests": ("loopstack.bench.serving.turn_requests",
                          "Engine requests per tool-call turn; a new tool set's first turn."),
    }),
    "memory": ("Long-term memory: latency, isolation, LoCoMo recall, Postgres.", {
        "latency": ("loopstack.bench.memory.latency", "Recall latency and write throughput."),
        "isolation": ("loopstack.bench.memory.isolation",
                      "Zero cross-user results, real embedder."),
        "locomo": ("loopstack.bench.memory.locomo", "Recall@k of evidence on LoCoMo."),
        "multilingual": ("loopstack.bench.memory.multilingual",
                         "Chinese + English recall@1 and p99: MiniLM vs multilingual-e5."),
        "postgres": ("loopstack.bench.memory.postgres",
                     "Postgres: bulk add, cross-server lag, recall with app servers."),
        "redaction": ("loopstack.bench.memory.redaction",
                      "LoCoMo's turns through redaction: 0 changed."),
        "embedder-speed": ("loopstack.bench.memory.embedder_speed",
                           "Ingest and recall per embedder (MiniLM vs e5, cache, threads)."),
    }),
    "corpus": ("The real-world tool-schema corpus the serving benchmarks use.", {
        "build": ("loopstack.bench.corpus.build",
                  "Rebuild loopstack/bench/corpus/tool_schemas.jsonl (offline)."),
    }),
    "agent": ("The agent loop's own cost (a scripted model: no server).", {
        "overhead": ("loopstack.bench.agent.overhead", "Host time per step with history, vs none."),
        "selection": ("loopstack.bench.agent.selection",
                      "Right tool among 5/10/30 by order and ranking; false calls (a server)."),
        "bfcl": ("loopstack.bench.agent.bfcl",
                 "The same on BFCL's published multiple-function and irrelevance sets."),
        "after-results": ("loopstack.bench.agent.after_results",
                          "After a tool result, does the model answer from it (a server)."),
    }),
    "server": ("A running server's own figures.", {
        "cpu": ("loopstack.bench.load.process_cpu",
                "CPU seconds by process kind of a server, snapshots around a run."),
    }),
    "golden": ("The golden agent task set (a running server).", {
        "run": ("loopstack.bench.golden.run",
                "Run the golden tasks through `loopstack agent run`."),
        "bootstrap": ("loopstack.bench.golden.bootstrap",
                      "Worked examples from passed practice runs."),
    }),
}  # fmt: skip


def run_script(module: str, prog: str, args: list[str]) -> int:
    """Run ``module.main(args)`` (its own typer app, `loopstack.bench.commandline`) with ``prog`` as
    the name in its usage line; its exit status."""
    main = importlib.import_module(module).main
    token = PROG.set(prog)
    try:
        out = main(args)
    finally:
        PROG.reset(token)
    return out if isinstance(out, int) else 0


def _script_command(module: str, prog: str) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        raise typer.Exit(run_script(module, prog, ctx.args))

    return command


def _mount_scripts() -> None:
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    for subject, (about, scripts) in SCRIPTS.items():
        group = typer.Typer(help=about, no_args_is_help=True)
        for name, (module, summary) in scripts.items():
            group.command(
                name,
                help=f"{summary} Options: --help.",
                context_settings=settings,
                add_help_option=False,
            )(_script_command(module, f"loopstack bench {subject} {name}"))
        app.add_typer(group, name=subject)


_mount_scripts()
