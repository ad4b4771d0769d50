"""PNG plots of a load run (matplotlib, Agg): step latency, throughput and goodput against
the load, and the step-latency CDF of each level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loopstack.bench.load.metrics import LevelSummary
from loopstack.bench.load.result import RunResult


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
