"""The soak bench's report arithmetic, on synthetic outcomes (no server)."""

from __future__ import annotations

import pytest

from loopstack.bench.serving.soak import GAUGES, Outcome, Report, main, parse_gauges, summarize

METRICS = """# HELP loopstack_requests_running Requests generating
# TYPE loopstack_requests_running gauge
loopstack_requests_running 3.0
loopstack_requests_waiting 2.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
loopstack_requests_running_total 99.0
"""


def test_parse_gauges_sums_label_sets_and_ignores_others() -> None:
    g = parse_gauges(METRICS)
    assert g == {
        "loopstack_requests_running": 3.0,
        "loopstack_requests_waiting": 2.0,
        "vllm:num_requests_running": 5.0,
        "vllm:num_requests_waiting": 0.0,
    }
    assert parse_gauges("") == dict.fromkeys(GAUGES, 0.0)


def _report(**kw: object) -> Report:
    zero = dict.fromkeys(GAUGES, 0.0)
    base = dict(
        outcomes=[
            Outcome("streams", 200, chunks=10),
            Outcome("streams", 200, chunks=10, retries=2),
            Outcome("streams", 200, disconnected=True, chunks=2),
            Outcome("burst", 200),
            Outcome("burst", 429, retry_after=True),
            Outcome("burst", 429, retry_after=False),
            Outcome("burst", 0, error="reset"),
            Outcome("burst", 400),
        ],
        samples=[
            {**zero, "loopstack_requests_running": 8, "loopstack_requests_waiting": 16},
            {**zero, "loopstack_requests_running": 8, "vllm:num_requests_running": 9},
        ],
        before={**zero, "vllm:num_requests_running": 1.0},
        after={**zero, "vllm:num_requests_running": 1.0},
        settle_s=2.5,
        rss_before=100 * 2**20,
        rss_after=110 * 2**20 + 2**19,
    )
    base.update(kw)
    return Report(**base)  # type: ignore[arg-type]


def test_summarize_counts_each_outcome_once() -> None:
    s = summarize(_report())
    assert s["phases"]["streams"] == {"requests": 3, "completed": 2, "disconnected": 1,
                                      "retries_after_429": 2}  # fmt: skip
    burst = s["phases"]["burst"]
    assert burst["requests"] == 5 and burst["completed"] == 1
    assert burst["429"] == 2 and burst["429_with_retry_after"] == 1
    assert burst["server_errors"] == 1 and burst["other_4xx"] == 1
    assert s["peak_held"] == 24  # running + waiting at their highest
    assert s["peak"]["vllm:num_requests_running"] == 9
    assert s["back_to_baseline"] is True
    assert s["rss_before_mib"] == 100.0 and s["rss_after_mib"] == 110.5
    assert s["rss_delta_mib"] == 10.5


def test_summarize_flags_what_did_not_come_back() -> None:
    zero = dict.fromkeys(GAUGES, 0.0)
    s = summarize(_report(after={**zero, "loopstack_requests_running": 1.0}, rss_after=None,
                          samples=[]))  # fmt: skip
    assert s["back_to_baseline"] is False
    assert s["rss_delta_mib"] is None and s["peak_held"] == 0


def test_refuses_a_remote_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--base-url", "http://example.com:8000"]) == 2  # a usage error, as argparse's
    assert "loopback server only" in capsys.readouterr().err
