"""Every output format reads the same ``RunResult``: JSON, CSV, PNG plots, one HTML file.

``write_report(result, out_dir)`` writes ``result.json`` (the whole tree, steps included),
``levels.csv`` (one row per arm and level), ``steps.csv`` (one row per model call), four
PNGs (step latency, throughput and goodput against the load, step-latency CDFs) and
``report.html`` with the plots inlined as base64 (opens without a network).
"""

from __future__ import annotations

import base64
import csv
import html
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.agents.metrics import LevelSummary
from bench.agents.result import RunResult, save_result, summary_line

LEVEL_COLUMNS = [
    ("arm", lambda s: s.arm),
    ("level", lambda s: s.level),
    ("mode", lambda s: s.mode),
    ("steps", lambda s: s.steps),
    ("warm_steps", lambda s: s.warm_steps),
    ("cold_steps", lambda s: s.cold_steps),
    ("tasks_done", lambda s: s.tasks_done),
    ("window_s", lambda s: s.window_s),
    ("step_p50_s", lambda s: s.step_latency.p50),
    ("step_p90_s", lambda s: s.step_latency.p90),
    ("step_p95_s", lambda s: s.step_latency.p95),
    ("step_p99_s", lambda s: s.step_latency.p99),
    ("ttft_p50_s", lambda s: s.ttft.p50),
    ("ttft_p95_s", lambda s: s.ttft.p95),
    ("cold_step_p50_s", lambda s: s.cold_step_latency.p50),
    ("cold_ttft_p50_s", lambda s: s.cold_ttft.p50),
    ("task_p50_s", lambda s: s.task_latency.p50),
    ("steps_per_s", lambda s: s.steps_per_s),
    ("tasks_per_min", lambda s: s.tasks_per_min),
    ("output_tok_s", lambda s: s.output_tok_s),
    ("model_calls_per_task", lambda s: s.model_calls_per_task),
    ("prompt_tokens_per_task", lambda s: s.prompt_tokens_per_task),
    ("completion_tokens_per_task", lambda s: s.completion_tokens_per_task),
    ("cached_tokens_per_task", lambda s: s.cached_tokens_per_task),
    ("errors", lambda s: s.errors),
    ("http_429", lambda s: s.http_429),
    ("goodput", lambda s: s.goodput),
    ("slo_s", lambda s: s.slo_s),
    ("prompt_tokens_mean", lambda s: s.prompt_tokens_mean),
    ("prefix_cache_hit_rate", lambda s: s.cache.hit_rate),
    ("engine_queue_s", lambda s: s.engine.get("queue_s")),
    ("engine_prefill_s", lambda s: s.engine.get("prefill_s")),
    ("engine_decode_s", lambda s: s.engine.get("decode_s")),
    ("engine_requests", lambda s: s.engine.get("requests")),
    ("client_cpu_s_per_step", lambda s: s.client_cpu_s_per_step),
    ("saturated", lambda s: s.saturated),
]


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_csv(result: RunResult, out: Path) -> list[Path]:
    levels = out / "levels.csv"
    with levels.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([c for c, _ in LEVEL_COLUMNS])
        for lv in result.levels:
            w.writerow([_csv(get(lv.summary)) for _, get in LEVEL_COLUMNS])
    steps = out / "steps.csv"
    with steps.open("w", newline="") as fh:
        w = csv.writer(fh)
        rows = [asdict(s) for lv in result.levels for s in lv.steps]
        cols = list(rows[0]) if rows else ["arm"]
        w.writerow(cols)
        for r in rows:
            w.writerow([_csv(r[c]) for c in cols])
    return [levels, steps]


def _csv(v: Any) -> Any:
    return "" if v is None else v


# ---------------------------------------------------------------------------
# plots


def _axes(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # no data, no legend (and no warning)
        ax.legend(fontsize=7)


def _series(result: RunResult) -> dict[str, list[LevelSummary]]:
    return {arm: result.summaries(arm) for arm in result.arms()}


def write_plots(result: RunResult, out: Path) -> list[Path]:
    xlabel = "concurrent agents" if result.mode == "closed" else "arrivals (tasks/s)"
    series = _series(result)
    paths = []

    fig, ax = _axes("Step latency (warm steps)", xlabel, "seconds")
    for arm, sums in series.items():
        xs = [s.level for s in sums]
        for q, style in (("p50", "-o"), ("p95", "--s"), ("p99", ":^")):
            ax.plot(xs, [getattr(s.step_latency, q) for s in sums], style, label=f"{arm} {q}")
    slo = result.config.get("slo_p95_step_s")
    if slo:
        ax.axhline(slo, color="red", lw=0.8, label=f"SLO {slo:g} s")
    _legend(ax)
    paths.append(_save(fig, out / "step_latency_vs_agents.png"))

    fig, ax = _axes("Throughput", xlabel, "model calls (steps) / s")
    ax2 = ax.twinx()
    ax2.set_ylabel("output tok/s")
    for arm, sums in series.items():
        xs = [s.level for s in sums]
        ax.plot(xs, [s.steps_per_s for s in sums], "-o", label=f"{arm} steps/s")
        ax2.plot(xs, [s.output_tok_s for s in sums], "--x", label=f"{arm} tok/s")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="lower right", fontsize=7)
    paths.append(_save(fig, out / "throughput_vs_agents.png"))

    fig, ax = _axes("Step latency CDF (warm steps)", "step latency (s)", "share of steps")
    for lv in result.levels:
        lat = sorted(s.latency_s for s in lv.steps if s.ok and not s.cold and not s.warmup)
        if lat:
            ys = [(i + 1) / len(lat) for i in range(len(lat))]
            ax.step(lat, ys, where="post", label=f"{lv.summary.arm} {lv.summary.level:g}")
    _legend(ax)
    paths.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = _axes("Goodput (share of steps within the SLO)", xlabel, "goodput")
    for arm, sums in series.items():
        ax.plot([s.level for s in sums], [s.goodput for s in sums], "-o", label=arm)
    ax.axhline(0.95, color="red", lw=0.8, label="95 %")
    ax.set_ylim(0, 1.05)
    _legend(ax)
    paths.append(_save(fig, out / "goodput_vs_agents.png"))
    return paths


# ---------------------------------------------------------------------------
# HTML


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_f(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(result: RunResult, plots: list[Path]) -> str:
    h = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>loopstack agent bench"
        "</title><style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "table{border-collapse:collapse;font-size:12px;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "img{max-width:48%;margin:4px}code,pre{background:#f4f4f4}</style></head><body>",
        "<h1>Agent load test</h1>",
        f"<p><b>{h(summary_line(result))}</b></p>",
        f"<p>created {h(result.created)}, mode {h(result.mode)}, scenario "
        f"<code>{h(str(result.scenario.get('name')))}</code></p>",
        _table(
            ["target", "base_url", "model", "extra_body"],
            [[t["name"], t["base_url"], t["model"], str(t["extra_body"])] for t in result.targets],
        ),
        "<h2>Per level (warm steps)</h2>",
        _table(
            [c for c, _ in LEVEL_COLUMNS],
            [[get(lv.summary) for _, get in LEVEL_COLUMNS] for lv in result.levels],
        ),
        "<h2>Cold (first use of a tool schema) vs warm</h2>",
        _table(
            [
                "arm",
                "level",
                "cold steps",
                "cold p50 s",
                "warm p50 s",
                "cold TTFT p50 s",
                "warm TTFT p50 s",
            ],
            [
                [
                    s.arm,
                    s.level,
                    s.cold_steps,
                    s.cold_step_latency.p50,
                    s.step_latency.p50,
                    s.cold_ttft.p50,
                    s.ttft.p50,
                ]
                for s in (lv.summary for lv in result.levels)
                if s.cold_steps
            ],
        ),
    ]
    if result.comparisons:
        parts += [
            "<h2>Side by side (ratio num / den, same level)</h2>",
            _table(
                ["what", "level", "num", "den", "step p50", "TTFT p50", "steps/s", "tok/s"],
                [
                    [
                        c.what,
                        c.level,
                        c.num,
                        c.den,
                        c.step_p50_ratio,
                        c.ttft_p50_ratio,
                        c.steps_per_s_ratio,
                        c.output_tok_s_ratio,
                    ]
                    for c in result.comparisons
                ],
            ),
        ]
    if result.plan:
        p = result.plan
        parts += [
            "<h2>Capacity plan</h2>",
            f"<p><b>{h(p.line())}</b></p>",
            f"<p>Formula: <code>{h(p.formula)}</code>; by request rate: "
            f"{h(_f(p.replicas_by_rate))} replica(s) (per agent {_f(p.per_agent_calls_per_s, 3)}"
            f" calls/s, one replica {_f(p.replica_calls_per_s, 3)} calls/s at C*)</p>",
            _table(
                ["agents", "p95 step s", "goodput", "steps/s", "meets SLO"],
                [[x.agents, x.p95_step_s, x.goodput, x.steps_per_s, x.meets] for x in p.points],
            ),
            "<p>Assumptions:</p><ul>"
            + "".join(f"<li>{h(a)}</li>" for a in p.assumptions + p.notes)
            + "</ul>",
        ]
    if result.requests:
        parts += ["<h2>Request level: vllm bench serve</h2>", _requests_html(result.requests)]
    if result.notes:
        parts += ["<h2>Notes</h2><ul>"] + [f"<li>{h(n)}</li>" for n in result.notes] + ["</ul>"]
    parts.append("<h2>Plots</h2>")
    for path in plots:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f"<img alt='{h(path.stem)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _requests_html(req: dict[str, Any]) -> str:
    out = []
    vllm = req.get("vllm") or {}
    if vllm:
        keys = [k for k in vllm if k != "command"]
        out.append(_table(["figure", "value"], [[k, vllm[k]] for k in keys]))
        out.append(f"<pre>{html.escape(str(vllm.get('command', '')))}</pre>")
    if req.get("ours"):
        out.append("<p>Our harness, same load:</p>")
        out.append(_table(["figure", "value"], [[k, v] for k, v in req["ours"].items()]))
    if req.get("comparison"):
        out.append("<p>Cross-check (ours / vllm bench serve):</p>")
        out.append(_table(["figure", "value"], [[k, v] for k, v in req["comparison"].items()]))
    return "\n".join(out)


def write_report(result: RunResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    save_result(result, out / "result.json")
    paths = [out / "result.json", *write_csv(result, out)]
    plots = write_plots(result, out) if result.levels else []
    page = out / "report.html"
    page.write_text(render_html(result, plots))
    return [*paths, *plots, page]
