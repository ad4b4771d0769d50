"""The replica model checked against published GPU measurements it was not fitted on, with
BLIS's coefficients beside it as the baseline.

The table (``tests/data/published_gpu_runs.json``) holds each run's figures, source and
workload. Three kinds of workload:

- ``server``: Poisson arrivals (MLPerf's Server scenario); predicted: the largest rate whose
  modelled TTFT p99 and TPOT p99 meet the run's SLO, and the TPOT mean at the measured rate
- ``offline``: every query queued at once (MLPerf's Offline); predicted: the saturation rate
- ``concurrency``: C clients, each sending its next request when the last one ends (``vllm
  bench serve --max-concurrency C``); the rate solves rate = C / e2e(rate); predicted: TTFT
  mean and median, TPOT, end-to-end mean

BLIS baseline (inference-sim, Apache-2.0; its published alpha/beta form, figures below, not
its code): step = beta0 + beta1 x uncached prefill tokens + beta2 x decode tokens;
TTFT += alpha0 + alpha1 x prompt tokens; every output token's ITL += alpha2 (its docs: the
alpha overheads "inflate TTFT and ITL" without blocking the next step). Only runs with a
coefficient set for their model, GPU and TP have a baseline figure.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopstack.bench.load import BenchError
from loopstack.bench.load.architecture import load_architecture
from loopstack.bench.load.enginesim import Engine, SimStats, max_entropy_lengths, simulate
from loopstack.bench.load.hardware import get_hardware
from loopstack.bench.load.replica import StepFn, max_rate
from loopstack.bench.load.roofline import Batch, Coefficients, ReplicaSpec, fit_coefficients, step_s

DEFAULT_TABLE = Path(__file__).resolve().parents[3] / "tests" / "data" / "published_gpu_runs.json"

# inference-sim/inference-sim defaults.yaml @ 1a6eb353412e981dba604fccd5096da4e8aee6da:
# (model, GPU, TP) -> (alpha0, alpha1, alpha2, beta0, beta1, beta2) in microseconds, fitted by
# BLIS on vLLM 0.8.4 runs (bf16 weights).
BLIS: dict[tuple[str, str, int], tuple[float, ...]] = {
    ("meta-llama/Llama-3.1-8B-Instruct", "h100", 1): (
        232.46191091038054, 1.752360364195244, 3357.4400353290152,
        5752.705191348184, 17.25086436834028, 5.999143920128404),
    ("meta-llama/Llama-3.1-8B-Instruct", "a100", 1): (
        7739.7334212001515, 2.308926798943791, 6276.246189076296,
        16441.531547147923, 47.837412108198656, 18.20560632171683),
    ("meta-llama/Llama-3.1-70B-Instruct", "h100", 8): (  # llama-3.3-70b, same architecture
        27262.037667007146, 12.483736088204523, 112.29324980868637,
        14140.825207623911, 10.025593497696502, 19.401640879612657),
}  # fmt: skip

METRICS = ("ttft", "tpot", "e2e", "max_rate")


@dataclass
class Figure:
    run: str
    metric: str  # ttft | tpot | e2e | max_rate
    stat: str  # mean | median
    measured: float
    ours: float | None
    blis: float | None = None
    roof: float | None = None  # the pure roofline: datasheet peaks, no overheads

    def err(self, which: str = "ours") -> float | None:
        got = {"ours": self.ours, "blis": self.blis, "roof": self.roof}[which]
        return None if got is None else got / self.measured - 1.0


@dataclass
class Report:
    figures: list[Figure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    coeffs: Coefficients | None = None

    def median_error(
        self, metric: str, which: str = "ours", same_runs: bool = False
    ) -> float | None:
        errs = [
            abs(e)
            for f in self.figures
            if f.metric == metric and (not same_runs or f.blis is not None)
            for e in [f.err(which)]
            if e is not None
        ]
        return statistics.median(errs) if errs else None


@dataclass(frozen=True)
class _Engine:
    step: StepFn
    ttft_over: float  # per request
    ttft_per_token: float
    itl_extra: float  # added to every output token's latency (BLIS alpha2)
    budget: int
    max_seqs: int
    kv_tokens: float

    def overhead(self, prompt: float) -> float:
        return self.ttft_over + self.ttft_per_token * prompt

    def sim(self) -> Engine:
        return Engine(self.step, self.overhead, self.budget, self.max_seqs, self.kv_tokens)


def engines(run: dict[str, Any], coeffs: Coefficients) -> tuple[_Engine, _Engine | None]:
    arch = load_architecture(run["model"])
    spec = ReplicaSpec(get_hardware(run["hardware"]), arch, int(run.get("tp", 1)),
                       run.get("weights", "bf16"), run.get("kv", "bf16"))  # fmt: skip
    kv = float(spec.kv_capacity_tokens())
    ours = _Engine(lambda b: step_s(spec, coeffs, b), coeffs.request_s, coeffs.request_token_s,
                   0.0, spec.token_budget, spec.max_seqs, kv)  # fmt: skip
    key = (arch.name, run["hardware"], int(run.get("tp", 1)))
    blis = None
    if key in BLIS:
        a0, a1, a2, b0, b1, b2 = (x * 1e-6 for x in BLIS[key])

        def blis_step(b: Batch) -> float:
            return b0 + b1 * b.prefill_tokens + b2 * b.decode_seqs

        blis = _Engine(blis_step, a0, a1, a2, spec.token_budget, spec.max_seqs, kv)
    return ours, blis


# Requests a simulated run sends: MLPerf's Server at a trial rate, its Offline (every query at
# once; a few times max_num_seqs, so the ramp and the tail weigh little), and a concurrency
# sweep when the source does not say how many prompts it sent.
SERVER_REQUESTS = 1500
OFFLINE_BATCHES = 4
CONCURRENCY_PROMPTS = 200


def predict_server(e: _Engine, wl: dict[str, Any], at_rate: float) -> dict[str, float | None]:
    """The largest Poisson rate whose simulated TTFT p99 and TPOT p99 meet the SLO, and the
    mean TPOT at the measured rate."""
    inp, out = round(float(wl["input_tokens"])), round(float(wl["output_tokens"]))

    def run(rate: float) -> SimStats:
        return simulate(e.sim(), inp, out, mode="poisson", n=SERVER_REQUESTS, rate=rate)

    # a finite run above the saturation rate can still meet the SLO before its queue grows:
    # MLPerf's Server runs 10 minutes, so no rate past the Offline throughput is feasible
    saturation = predict_offline(e, wl)["max_rate"] or 0.0

    def ok(rate: float) -> bool:
        if rate >= saturation:
            return False
        st = run(rate)
        return (
            st.p("ttft", 99) <= wl["slo_ttft_p99_s"]
            and st.p("tpot", 99) + e.itl_extra <= wl["slo_tpot_p99_s"]
        )

    # the search starts at half the saturation rate: low trial rates cost the most iterations
    hi = max(saturation / 2, 1e-3)
    return {"max_rate": max_rate(ok, hi=hi, tol=0.005),
            "tpot": run(at_rate).mean("tpot") + e.itl_extra}  # fmt: skip


def predict_offline(e: _Engine, wl: dict[str, Any]) -> dict[str, float | None]:
    """Every query queued at once: queries over the simulated makespan."""
    inp, out = round(float(wl["input_tokens"])), round(float(wl["output_tokens"]))
    n = OFFLINE_BATCHES * e.max_seqs
    return {"max_rate": simulate(e.sim(), inp, out, mode="offline", n=n).throughput_rps}


def predict_concurrency(e: _Engine, wl: dict[str, Any]) -> dict[str, float | None]:
    """``vllm bench serve --max-concurrency C`` at an unbounded request rate: C clients that
    start together, ``num_prompts`` requests in all."""
    c, out = int(wl["concurrency"]), round(float(wl["output_tokens"]))
    n = int(wl.get("num_prompts", CONCURRENCY_PROMPTS))
    outputs = None
    if "output_cap" in wl:  # lengths vary under a cap: the cap and the mean, nothing else
        outputs = max_entropy_lengths(float(wl["output_tokens"]), int(wl["output_cap"]), n)
    st = simulate(e.sim(), round(float(wl["input_tokens"])), out, mode="closed", n=n,
                  concurrency=c, outputs=outputs)  # fmt: skip
    mean_out, extra = st.mean("outputs"), e.itl_extra
    e2e = st.mean("e2e") + (mean_out - 1) * extra
    # TPOT as the sources derive it: (e2e mean - TTFT mean) / (mean output - 1)
    tpot = (e2e - st.mean("ttft")) / max(1.0, mean_out - 1)
    return {"ttft_median": st.median("ttft"), "ttft_mean": st.mean("ttft"), "tpot": tpot,
            "e2e": e2e}  # fmt: skip


def validate_table(path: Path = DEFAULT_TABLE, coeffs: Coefficients | None = None) -> Report:
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"cannot read the validation table {path}: {exc}") from exc
    coeffs = coeffs or fit_coefficients()
    rep = Report(coeffs=coeffs)
    pure = Coefficients(compute_eff=1.0, bandwidth_eff=1.0, fitted_on="nothing: datasheet peaks")
    for run in runs:
        if run.get("role") != "holdout":
            rep.skipped.append(
                f"{run['id']}: {run.get('workload', {}).get('note', run.get('role'))}"
            )
            continue
        ours, blis = engines(run, coeffs)
        roof, _ = engines(run, pure)
        wl, m = run["workload"], run["measured"]
        preds: list[dict[str, float | None]] = []
        for e in (ours, blis, roof):
            if e is None:
                preds.append({})
            elif wl["kind"] == "server":
                preds.append(predict_server(e, wl, m["max_rate_qps"]))
            elif wl["kind"] == "offline":
                preds.append(predict_offline(e, wl))
            else:
                preds.append(predict_concurrency(e, wl))
        o, b, r = preds
        pairs = [
            (
                "max_rate",
                "offline" if wl["kind"] == "offline" else "at SLO",
                "max_rate_qps",
                "max_rate",
            ),
            ("tpot", "mean", "tpot_mean_s", "tpot"),
            ("tpot", "median", "tpot_median_s", "tpot"),
            ("ttft", "mean", "ttft_mean_s", "ttft_mean"),
            ("ttft", "median", "ttft_median_s", "ttft_median"),
            ("e2e", "mean", "e2e_mean_s", "e2e"),
        ]
        for metric, stat, key, pk in pairs:
            if key in m:
                rep.figures.append(
                    Figure(run["id"], metric, stat, float(m[key]), o.get(pk), b.get(pk), r.get(pk))
                )
    return rep


def summary_lines(rep: Report) -> list[str]:
    out = []
    for metric, label in (("e2e", "end-to-end"), ("tpot", "TPOT"), ("ttft", "TTFT"),
                          ("max_rate", "max rate (MLPerf Server at SLO; Offline)")):  # fmt: skip
        ours = rep.median_error(metric)
        if ours is None:
            continue
        n = sum(1 for f in rep.figures if f.metric == metric)
        b_same, o_same = (
            rep.median_error(metric, "blis", True),
            rep.median_error(metric, same_runs=True),
        )
        base = (
            f"; on the runs BLIS has coefficients for: ours {o_same:.1%}, BLIS {b_same:.1%}"
            if b_same is not None and o_same is not None
            else ""
        )
        roof = rep.median_error(metric, "roof")
        pure = f"; a pure roofline {roof:.1%}" if roof is not None else ""
        out.append(
            f"{label} +/-{ours:.1%} (median error over {n} published figures held out{pure}{base})"
        )
    return out


def table_lines(rep: Report) -> list[str]:
    """One markdown row a figure: run, metric, measured, ours (error), BLIS (error)."""

    def fmt(x: float | None, metric: str) -> str:
        if x is None:
            return "-"
        return f"{x:.2f} q/s" if metric == "max_rate" else f"{x * 1e3:.1f} ms"

    def pct(e: float | None) -> str:
        return "" if e is None else f" ({e:+.1%})"

    rows = [
        "| run | figure | published | ours (modelled) | BLIS coefficients | pure roofline |",
        "|---|---|---|---|---|---|",
    ]
    for f in rep.figures:
        rows.append(
            f"| {f.run} | {f.metric} {f.stat} | {fmt(f.measured, f.metric)} | "
            f"{fmt(f.ours, f.metric)}{pct(f.err())} | {fmt(f.blis, f.metric)}"
            f"{pct(f.err('blis'))} | {fmt(f.roof, f.metric)}{pct(f.err('roof'))} |"
        )
    return rows


def run() -> None:
    """``python -m loopstack.bench.load.published [TABLE]``: the per-figure table and the
    summary."""
    import sys

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TABLE
    rep = validate_table(path)
    assert rep.coeffs is not None
    print(f"Replica model: {rep.coeffs.describe()}; fitted on {rep.coeffs.fitted_on}.\n")
    print("\n".join(table_lines(rep)))
    print()
    print("\n".join(f"- {line}" for line in summary_lines(rep)))
    for s in rep.skipped:
        print(f"- not predicted: {s}")


if __name__ == "__main__":
    run()
