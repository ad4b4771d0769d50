"""Metrics of the agent load test against hand-computed cases (pure functions)."""

from __future__ import annotations

import math

import pytest

from loopstack.bench.load.metrics import (
    StepRecord,
    TaskRecord,
    cache_delta,
    dist,
    engine_delta,
    goodput,
    latency_growing,
    prom_counter,
    summarize,
)


def step(start: float, lat: float, **kw: object) -> StepRecord:
    base: dict[str, object] = dict(
        arm="ours", level=2, agent=0, task=0, step=0, start=start, latency_s=lat,
        ttft_s=lat / 2, ok=True, completion_tokens=10, prompt_tokens=100,
    )  # fmt: skip
    base.update(kw)
    return StepRecord(**base)  # type: ignore[arg-type]


def test_dist_percentiles_linear_interpolation() -> None:
    d = dist([4.0, 1.0, 3.0, 2.0, 5.0])
    assert d.n == 5 and d.mean == 3.0 and d.max == 5.0
    assert d.p50 == 3.0
    # position (n-1)*q = 4*0.9 = 3.6 -> 4 + 0.6*(5-4)
    assert d.p90 == pytest.approx(4.6)
    assert d.p95 == pytest.approx(4.8)
    assert d.p99 == pytest.approx(4.96)
    assert dist([]).p50 is None
    assert dist([math.nan, 2.0]).n == 1


def test_goodput_counts_failures_as_misses() -> None:
    assert goodput([1.0, 2.0, 3.0, 4.0], [True, True, True, True], 2.5) == 0.5
    assert goodput([1.0, 2.0, 3.0, 4.0], [True, False, True, True], 2.5) == 0.25
    assert goodput([1.0, 2.5], [True, True], 2.5) == 1.0  # the SLO bound itself is met
    assert goodput([], [], 1.0) is None


def test_summarize_rates_tokens_and_cold_warm() -> None:
    steps = [
        step(0.0, 4.0, cold=True),  # cold: excluded from the warm percentiles
        step(1.0, 2.0),
        step(2.0, 2.0, agent=1),
        step(3.0, 3.0, agent=1, completion_tokens=30),
        step(4.0, 6.0, ok=False, status=429, completion_tokens=0),
    ]
    tasks = [
        TaskRecord("ours", 2, 0, 0, "a", 0.0, 5.0, 2, "done"),
        TaskRecord("ours", 2, 1, 0, "b", 2.0, 10.0, 3, "error"),
    ]
    s = summarize("ours", 2, "closed", steps, tasks, slo_s=2.5)
    # window: first start 0.0 -> last end 10.0
    assert s.window_s == 10.0
    assert s.steps == 5 and s.warm_steps == 3 and s.cold_steps == 1
    assert s.errors == 1 and s.http_429 == 1
    assert s.step_latency.p50 == 2.0 and s.cold_step_latency.p50 == 4.0
    # 4 ok steps over 10 s; (10+10+10+30) tokens over 10 s
    assert s.steps_per_s == pytest.approx(0.4)
    assert s.output_tok_s == pytest.approx(6.0)
    # one finished task over 10 s -> 6 per minute; 2 model calls per finished task
    assert s.tasks_per_min == pytest.approx(6.0)
    assert s.model_calls_per_task == 2.0
    # the finished task (agent 0, task 0): two ok calls of 100 + 10 tokens (the failed one
    # counts nothing; agent 1's task did not finish)
    assert s.prompt_tokens_per_task == 200.0 and s.completion_tokens_per_task == 20.0
    assert s.cached_tokens_per_task is None  # no step carried cached-token details
    # goodput over warm steps incl. the failed one: 2.0, 2.0 ok; 3.0 late; failure -> 2/4
    assert s.goodput == pytest.approx(0.5)
    assert s.ttft.p50 == 1.0


def test_summarize_excludes_warmup() -> None:
    steps = [step(0.0, 9.0, warmup=True), step(1.0, 1.0), step(2.0, 1.0)]
    s = summarize("ours", 1, "closed", steps, [], slo_s=None)
    assert s.steps == 2 and s.window_s == 2.0 and s.goodput is None
    assert s.step_latency.max == 1.0


METRICS_BEFORE = """# HELP vllm:prefix_cache_queries Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.79e+09
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 55.0
loopstack_requests_total{route="/v1/chat/completions",status="200"} 3.0
"""
METRICS_AFTER = """vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1800.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 200.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 700.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
"""


def test_cache_hit_rate_from_two_scrapes() -> None:
    assert prom_counter(METRICS_BEFORE, "vllm:prefix_cache_queries") == 1000.0
    assert prom_counter(METRICS_BEFORE, "vllm:prefix_cache_hits") == 200.0  # not external_
    assert prom_counter(METRICS_BEFORE, "vllm:nothing") is None
    c = cache_delta(METRICS_BEFORE, METRICS_AFTER)
    # queries 2000-1000 = 1000, hits 800-200 = 600 (engines summed)
    assert c.queries == 1000.0 and c.hits == 600.0
    assert c.hit_rate == pytest.approx(0.6)
    assert cache_delta(None, METRICS_AFTER).hit_rate is None
    assert cache_delta(METRICS_AFTER, METRICS_AFTER).hit_rate is None  # no queries


def test_latency_growing() -> None:
    assert not latency_growing([1.0] * 9)
    assert latency_growing([1, 1, 1, 2, 2, 2, 5, 6, 7])
    assert not latency_growing([1, 1, 1, 1.5, 1.5, 1.5, 1.9, 1.9, 1.9])
    assert not latency_growing([1, 50])  # too few to say


def test_engine_breakdown_from_histograms() -> None:
    before = (
        'vllm:request_queue_time_seconds_sum{engine="0"} 1.0\n'
        'vllm:request_queue_time_seconds_count{engine="0"} 2.0\n'
        'vllm:request_decode_time_seconds_sum{engine="0"} 10.0\n'
        'vllm:request_decode_time_seconds_count{engine="0"} 2.0\n'
    )
    after = (
        'vllm:request_queue_time_seconds_sum{engine="0"} 7.0\n'
        'vllm:request_queue_time_seconds_count{engine="0"} 5.0\n'
        'vllm:request_decode_time_seconds_sum{engine="0"} 10.0\n'
        'vllm:request_decode_time_seconds_count{engine="0"} 2.0\n'
    )
    e = engine_delta(before, after)
    assert e["queue_s"] == pytest.approx(2.0) and e["requests"] == 3  # 6 s over 3 requests
    assert e["decode_s"] is None and e["prefill_s"] is None  # no new requests / absent
    assert engine_delta(None, after) == {}
