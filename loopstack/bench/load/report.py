"""Every output format reads the same ``RunResult``; one module per format.

``write_report(result, out_dir)`` writes ``result.json`` (the whole tree, steps included;
`loopstack.bench.load.result`), ``levels.csv`` and ``steps.csv``
(`loopstack.bench.load.report_csv`), four PNGs (step latency, throughput and goodput against the
load, step-latency CDFs; `loopstack.bench.load.report_plots`) and ``report.html`` with the plots
inlined (`loopstack.bench.load.report_html`).
"""

from __future__ import annotations

from pathlib import Path

from loopstack.bench.load.report_csv import write_csv
from loopstack.bench.load.report_html import render_html
from loopstack.bench.load.report_plots import write_plots
from loopstack.bench.load.result import RunResult, save_result


def write_report(result: RunResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    save_result(result, out / "result.json")
    paths = [out / "result.json", *write_csv(result, out)]
    plots = write_plots(result, out) if result.levels else []
    page = out / "report.html"
    page.write_text(render_html(result, plots))
    return [*paths, *plots, page]
