"""The HTML report of a load run: one self-contained page (plots inlined as base64, so it
opens without a network) with the summary line, per-level tables, the plan and the
request-level figures."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from loopstack.bench.load.report_csv import LEVEL_COLUMNS  # the HTML table shows the CSV columns
from loopstack.bench.load.result import RunResult, summary_line


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


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
    if result.validation or result.capacity:
        parts += _model_html(result)
    if result.gpu_plan:
        parts += [
            "<h2>GPU fleet plan (modelled from datasheets and config.json, not measured)</h2>",
            "<pre>" + h("\n".join(result.gpu_plan)) + "</pre>",
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


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


WORST = (("p95_s", "p95 step"), ("steps_per_s", "steps/s"), ("p50_s", "p50 step"))


def _model_html(result: RunResult) -> list[str]:
    """The modelled plan with its measured error and every assumption it makes."""
    h = html.escape
    parts = ["<h2 id='modelled-plan'>Modelled plan, checked against measurement</h2>"]
    v = result.validation
    if v:
        worst = [f"{label} {w:.1%}" for what, label in WORST if (w := v.worst(what)) is not None]
        parts += [
            f"<p><b>Measured prediction error on held-out levels {h(str(v.holdout_levels))}: "
            f"{h(', '.join(worst) or 'no held-out level')}</b> (worst absolute error; signed "
            "errors in the table; the model "
            f"was fitted on {h(str(v.fit_levels))} agents, RMS fit error {v.fit_error:.1%}).</p>",
            _table(
                ["agents", "role", "warm steps", "p50 s measured", "p50 s predicted", "error",
                 "p95 s measured", "p95 s predicted", "error", "steps/s measured",
                 "steps/s predicted", "error", "task p95 s measured", "task p95 s predicted"],
                [
                    [r.agents, r.role, r.warm_steps, r.measured_p50_s, r.predicted_p50_s,
                     _pct(r.error("p50_s")), r.measured_p95_s, r.predicted_p95_s,
                     _pct(r.error("p95_s")), r.measured_steps_per_s, r.predicted_steps_per_s,
                     _pct(r.error("steps_per_s")), r.measured_task_p95_s, r.predicted_task_p95_s]
                    for r in v.rows
                ],
            ),
        ]  # fmt: skip
    c = result.capacity
    if c:
        lines = c.lines()
        parts += [
            f"<p><b>{h(lines[0])}</b></p>",
            "<ul>" + "".join(f"<li>{h(x.strip())}</li>" for x in lines[1:]) + "</ul>",
            _table(
                ["agents per replica", "p50 step s", "p95 step s", "p95 task s", "steps/s",
                 "meets SLO"],
                [[p.agents, p.p50_step_s, p.p95_step_s, p.p95_task_s, p.steps_per_s, p.meets]
                 for p in c.points],
            ),
        ]  # fmt: skip
    if v:
        parts.append(
            "<p>The model assumes:</p><ul>"
            + "".join(f"<li>{h(a)}</li>" for a in v.assumptions)
            + "</ul>"
        )
    return parts
