"""The GPU replica model against published vLLM runs it was not fitted on
(tests/data/published_gpu_runs.json), BLIS's coefficients beside it.

The goal of issue #57 is asserted in three parts: end-to-end and TPOT (met: a plain test),
TTFT and the MLPerf Server rates (not met: each a strict xfail that runs the real prediction
and XPASSes, so fails, the day the model meets it, so the mark must go). Nothing here is
tuned on these runs: the fit's sources (`loopstack.bench.load.roofline.fit_coefficients`) are none
of them.
"""

from __future__ import annotations

import json

import pytest

from loopstack.bench.load.published import (
    DEFAULT_TABLE,
    Report,
    summary_lines,
    table_lines,
    validate_table,
)


@pytest.fixture(scope="module")
def report() -> Report:
    return validate_table(DEFAULT_TABLE)


def test_every_held_out_figure_is_predicted_and_sourced(report: Report) -> None:
    runs = json.loads(DEFAULT_TABLE.read_text())["runs"]
    held = [r for r in runs if r["role"] == "holdout"]
    assert all(r["source"] and r["url"].startswith("https://") for r in runs)
    assert {f.run for f in report.figures} == {r["id"] for r in held}
    assert all(f.ours is not None and f.ours > 0 for f in report.figures)
    # MLPerf's two single-GPU rates are in, the 70B one is listed as not predicted (why)
    rates = {f.run for f in report.figures if f.metric == "max_rate" and f.stat == "at SLO"}
    assert rates == {"mlperf51-h100-llama31-8b-server", "mlperf51-l40s-llama31-8b-server"}
    assert any(s.startswith("mlperf51-8xh100-70b") for s in report.skipped)
    assert len(table_lines(report)) == 2 + len(report.figures)
    assert any(line.startswith("TPOT") for line in summary_lines(report))


def test_derived_figures_follow_from_the_published_ones() -> None:
    # the RTX 4090 sweep: mean output = output tok/s / req/s; e2e = C / req/s (Little);
    # TPOT = (e2e - TTFT) / (output - 1), as the table's "derived" field says
    for r in json.loads(DEFAULT_TABLE.read_text())["runs"]:
        m, wl = r["measured"], r["workload"]
        if "output_tok_s" not in m:
            continue
        out = m["output_tok_s"] / m["rate_qps"]
        assert wl["output_tokens"] == pytest.approx(out, abs=0.05) and out < wl["output_cap"]
        assert m["e2e_mean_s"] == pytest.approx(wl["concurrency"] / m["rate_qps"], rel=0.01)
        tpot = (m["e2e_mean_s"] - m["ttft_mean_s"]) / (wl["output_tokens"] - 1)
        assert m["tpot_mean_s"] == pytest.approx(tpot, rel=1e-3)


def test_fit_sources_are_not_in_the_validation_table(report: Report) -> None:
    assert report.coeffs is not None
    table = DEFAULT_TABLE.read_text()
    assert "johnmusgrave" not in table and "defaults.yaml" not in table


def test_at_least_as_good_as_blis_where_both_predict(report: Report) -> None:
    for metric in ("tpot", "max_rate"):
        ours = report.median_error(metric, "ours", same_runs=True)
        blis = report.median_error(metric, "blis", same_runs=True)
        assert ours is not None and blis is not None
        assert ours <= blis, (metric, ours, blis)


def test_the_met_part_of_the_goal_on_held_out_runs(report: Report) -> None:
    # met since the second pass: end-to-end and TPOT medians within 10 % on held-out runs
    e2e, tpot = report.median_error("e2e"), report.median_error("tpot")
    assert e2e is not None and e2e <= 0.10
    assert tpot is not None and tpot <= 0.10


@pytest.mark.xfail(
    strict=True,
    reason="issue #57's TTFT goal is not met on the held-out runs (~34 %: the RTX 4090 sweep "
    "at 32-48 clients waits 3-8x longer than simulated; see the NOTES' third pass)",
)
def test_the_ttft_goal_on_held_out_runs(report: Report) -> None:
    ttft = report.median_error("ttft")
    assert ttft is not None and ttft <= 0.20


@pytest.mark.xfail(
    strict=True,
    reason="issue #57's MLPerf goal is not met: the simulated Server rates are +38 % (H100) "
    "and +62 % (L40S); the Offline saturation itself is 22-28 % high (see the NOTES' third pass)",
)
def test_the_mlperf_goal_on_held_out_runs(report: Report) -> None:
    for f in report.figures:
        if f.metric == "max_rate" and f.stat == "at SLO":  # MLPerf Server, H100 and L40S
            err = f.err()
            assert err is not None and abs(err) <= 0.15, f.run
