"""The vllm bench serve wrapper and the cross-check: arguments, rows, the ratio and spread
arithmetic, the interleaving of the runs and their seeds."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from loopstack.bench.cli import crosscheck_lines
from loopstack.bench.load import BenchError
from loopstack.bench.load import requests as rq
from loopstack.bench.load.metrics import StepRecord
from loopstack.bench.load.requests import (
    RequestLoad,
    compare,
    compare_runs,
    crosscheck_scenario,
    engine_check,
    find_tokenizer,
    ours_rows,
    pick_figures,
    pooled,
    vllm_args,
    vllm_figures,
    vllm_rows,
)


def _load(**kw: Any) -> RequestLoad:
    return RequestLoad("http://h:8000/v1", "k", "m", "/tok", **kw)


def test_vllm_args_match_the_load() -> None:
    load = _load(
        num_prompts=8,
        input_len=100,
        output_len=32,
        concurrency=2,
        request_rate=1.5,
        goodput_ttft_ms=500,
        seed=7003,
    )
    a = vllm_args(load, "/d", "f.json")
    kv = dict(itertools.pairwise(a))
    assert kv["--base-url"] == "http://h:8000" and kv["--endpoint"] == "/v1/chat/completions"
    assert kv["--backend"] == "openai-chat" and kv["--tokenizer"] == "/tok"
    assert kv["--random-input-len"] == "100" and kv["--random-output-len"] == "32"
    assert kv["--max-concurrency"] == "2" and kv["--num-prompts"] == "8"
    assert kv["--request-rate"] == "1.5" and kv["--goodput"] == "ttft:500"
    assert kv["--seed"] == "7003"
    # the same sampling as our scenario (greedy), not the server's default of 1.0
    assert kv["--temperature"] == "0"
    assert "--ignore-eos" in a and "--save-detailed" in a and "k" not in a  # key: env


def test_pick_figures_and_vllm_figures() -> None:
    raw = {
        "completed": 16,
        "duration": 40.0,
        "total_output_tokens": 1600,
        "output_throughput": 40.0,
        "mean_ttft_ms": 500.0,
        "median_ttft_ms": 400.0,
        "p99_itl_ms": 90.0,
        "input_lens": [1, 2],
        "date": "x",
    }
    assert pick_figures(raw) == {
        "completed": 16,
        "duration": 40.0,
        "total_output_tokens": 1600,
        "output_throughput": 40.0,
        "mean_ttft_ms": 500.0,
        "median_ttft_ms": 400.0,
        "p99_itl_ms": 90.0,
    }
    f = vllm_figures(raw)
    assert f["ttft_median_s"] == pytest.approx(0.4) and f["ttft_mean_s"] == pytest.approx(0.5)
    assert f["output_tok_s"] == 40.0 and f["duration_s"] == 40.0 and f["output_tokens"] == 1600


def test_vllm_rows_and_ours_rows_line_up() -> None:
    raw = {
        "start_times": [100.5, 100.0],
        "ttfts": [0.3, 0.2],
        "latencies": [2.0, 1.5],
        "output_lens": [64, 64],
        "input_lens": [157, 157],
        "errors": ["", "boom"],
    }
    rows = vllm_rows(raw)
    assert rows[0] == {
        "start_s": 0.5,
        "ttft_s": 0.3,
        "latency_s": 2.0,
        "output_tokens": 64,
        "prompt_tokens": 157,
        "ok": True,
    }
    assert rows[1]["start_s"] == 0.0 and rows[1]["ok"] is False
    assert vllm_rows({}) == []
    steps = [
        StepRecord("ours", 4, a, 0, 0, start, 2.0, 0.4, True, prompt_tokens=157,
                   completion_tokens=64, cached_tokens=16)
        for a, start in ((1, 3.0), (0, 2.5))
    ]  # fmt: skip
    got = ours_rows(steps)
    assert [r["start_s"] for r in got] == [0.0, 0.5]
    assert set(got[0]) == set(rows[0]) | {"cached_tokens"}


def test_compare_names_all_three_metrics() -> None:
    vllm = {"ttft_median_s": 0.4, "ttft_mean_s": 0.5, "output_tok_s": 40.0}
    ours = {"ttft_median_s": 0.42, "ttft_mean_s": 0.545, "output_tok_s": 38.0}
    c = compare(vllm, ours)
    assert c["ttft_median_s_ratio"] == pytest.approx(1.05)
    assert c["ttft_mean_s_ratio"] == pytest.approx(1.09)
    assert c["output_tok_s_ratio"] == pytest.approx(0.95)
    assert c["within_10pct"] is True
    # the mean counts too (it did not before), and so does a missing figure
    assert compare(vllm, ours | {"ttft_mean_s": 0.56})["within_10pct"] is False
    assert compare(vllm, ours | {"output_tok_s": None})["within_10pct"] is False


def _run(harness: str, pair: int, ttfts: list[float], tok_s: float, dur: float) -> dict[str, Any]:
    rows = [{"ttft_s": t, "ok": True} for t in ttfts] + [{"ttft_s": 0.0, "ok": False}]
    return {
        "harness": harness,
        "pair": pair,
        "seed": 10 + pair,
        "rows": rows,
        "figures": {
            "ttft_median_s": sorted(ttfts)[len(ttfts) // 2],
            "ttft_mean_s": sum(ttfts) / len(ttfts),
            "output_tok_s": tok_s,
            "duration_s": dur,
            "output_tokens": tok_s * dur,
        },
    }


def test_pooled_takes_every_request_and_the_summed_duration() -> None:
    a = _run("vllm", 0, [1.0, 1.0, 4.0], 20.0, 10.0)
    b = _run("vllm", 1, [2.0, 2.0, 2.0], 30.0, 30.0)
    p = pooled([a, b])
    assert p["requests"] == 6  # the failed row is left out
    assert p["ttft_median_s"] == pytest.approx(2.0)
    assert p["ttft_mean_s"] == pytest.approx(2.0)
    assert p["output_tok_s"] == pytest.approx((200 + 900) / 40)


def test_compare_runs_ratios_spread_and_verdict() -> None:
    runs = [
        _run("vllm", 0, [1.0, 1.0, 1.0], 20.0, 10.0),
        _run("ours", 0, [1.05, 1.05, 1.05], 19.0, 10.0),
        _run("ours", 1, [0.9, 0.9, 0.9], 21.0, 10.0),
        _run("vllm", 1, [1.0, 1.0, 1.0], 22.0, 10.0),
    ]
    c = compare_runs(runs)
    assert c["pairs"] == 2
    assert c["ttft_mean_s_ratios"] == pytest.approx([1.05, 0.9])
    assert c["ttft_mean_s_ratio_min"] == pytest.approx(0.9)
    assert c["ttft_mean_s_ratio_max"] == pytest.approx(1.05)
    assert c["ttft_mean_s_ratio_pooled"] == pytest.approx(0.975)
    assert c["output_tok_s_ratios"] == pytest.approx([0.95, 21 / 22])
    assert c["output_tok_s_vllm_spread"] == pytest.approx(1.1)
    assert c["output_tok_s_ours_spread"] == pytest.approx(21 / 19)
    assert c["within_10pct"] is True and c["within_10pct_pooled"] is True
    # one pair out of tolerance fails the check even when the pooled ratio holds
    runs[2] = _run("ours", 1, [0.85, 0.85, 0.85], 21.0, 10.0)
    c = compare_runs(runs)
    assert c["ttft_mean_s_ratio_min"] == pytest.approx(0.85)
    assert c["within_10pct"] is False and c["within_10pct_pooled"] is True
    with pytest.raises(BenchError):
        compare_runs(runs[:3])
    # a pair where the engine served another client is not compared
    dirty = [r | {"pair_clean": r["pair"] == 0} for r in runs]
    c = compare_runs(dirty)
    assert c["pairs"] == 1 and c["pairs_run"] == 2 and c["within_10pct"] is True
    assert c["ttft_mean_s_ratios"] == pytest.approx([1.05])
    assert compare_runs(dirty, need=2)["within_10pct"] is False  # too few clean pairs
    none = compare_runs([r | {"pair_clean": False} for r in runs])
    assert none["pairs"] == 0 and none["within_10pct"] is False
    assert none["ttft_mean_s_ratio_pooled"] is None


def _prom(done: float, running: float = 0, waiting: float = 0) -> str:
    return (
        f'vllm:request_success_total{{finished_reason="length"}} {done - 1}\n'
        f'vllm:request_success_total{{finished_reason="stop"}} 1\n'
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        f"vllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total {done}\n"
    )


def test_engine_check_tells_a_run_that_had_the_engine_to_itself() -> None:
    c = engine_check(_prom(10), _prom(26), 16)
    assert c["clean"] is True and c["engine_requests"] == 16
    assert c["engine_in_flight"] == [0.0, 0.0]
    assert engine_check(_prom(10), _prom(31), 16)["clean"] is False  # another client's
    assert engine_check(_prom(10, running=1), _prom(26), 16)["clean"] is False  # one ran on
    assert engine_check(_prom(10), _prom(26, waiting=2), 16)["clean"] is False
    assert engine_check(None, _prom(26), 16)["clean"] is None  # no /metrics: unknown
    assert engine_check("up 1\n", "up 1\n", 16)["clean"] is None  # not a vLLM server


def test_crosscheck_lines_print_the_spread_and_the_verdict() -> None:
    runs = [
        _run("vllm", 0, [1.0, 1.0, 1.0], 20.0, 10.0),
        _run("ours", 0, [1.3, 1.3, 1.3], 19.0, 10.0),
    ]
    req = {"runs": runs, "comparison": compare_runs(runs)}
    lines = crosscheck_lines(req)
    assert lines[0].startswith("run 0 vllm seed 10: TTFT median 1.000 s")
    assert "pairs 1.300  min 1.300 max 1.300 pooled 1.300" in lines[3]
    assert lines[-1].startswith("CROSSCHECK ours/vllm, 1 clean pair(s) of 1 run: NOT within")
    runs = [r | {"pair_clean": False} for r in runs]
    lines = crosscheck_lines({"runs": runs, "comparison": compare_runs(runs)})
    assert lines[0].endswith("(pair not compared: see engine)")
    assert lines[-1].startswith("CROSSCHECK ours/vllm, 0 clean pair(s) of 1 run: NOT within")


def test_crosscheck_scenario_is_single_step_without_tools() -> None:
    sc = crosscheck_scenario(["a b", "c d"], 64, temperature=0.5)
    assert sc.tool_choice == "none" and not sc.tools and sc.system_prompt == ""
    assert [t.steps for t in sc.tasks] == [1, 1] and sc.max_tokens == 64
    assert sc.extra_body == {"ignore_eos": True} and sc.temperature == 0.5


def test_crosscheck_interleaves_with_a_seed_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []

    def datasets(load: RequestLoad, seeds: list[int]) -> list[list[dict[str, Any]]]:
        return [[{"prompt": f"s{s}", "prompt_len": 3, "output_len": 64}] * 4 for s in seeds]

    async def vllm_run(load: RequestLoad, log: Path | None) -> dict[str, Any]:
        calls.append(("vllm", load.seed))
        run = _run("vllm", 0, [1.0] * 4, 20.0, 10.0)
        return run | {"command": "vllm bench serve", "clean": load.seed != dirty}

    async def ours_run(load: RequestLoad, data: list[dict[str, Any]], console: Any) -> Any:
        assert data[0]["prompt"] == f"s{load.seed}"  # the dataset made for this run's seed
        calls.append(("ours", load.seed))
        return _run("ours", 0, [1.0] * 4, 20.0, 10.0)

    monkeypatch.setattr(rq, "vllm_datasets", datasets)
    monkeypatch.setattr(rq, "_vllm_run", vllm_run)
    monkeypatch.setattr(rq, "_ours_run", ours_run)
    dirty = -1
    req = asyncio.run(rq.crosscheck(_load(seed=5000, num_prompts=4), repeats=3))
    assert calls == [("vllm", 5000), ("ours", 5001), ("ours", 5002), ("vllm", 5003),
                     ("vllm", 5004), ("ours", 5005)]  # fmt: skip
    assert [r["pair"] for r in req["runs"]] == [0, 0, 1, 1, 2, 2]
    assert req["load"]["seeds"] == [5000, 5001, 5002, 5003, 5004, 5005]
    assert req["comparison"]["within_10pct"] is True and req["comparison"]["pairs"] == 3
    # another client used the engine during pair 1: it is run again with new seeds
    calls.clear()
    dirty = 5003
    req = asyncio.run(rq.crosscheck(_load(seed=5000, num_prompts=4), repeats=3))
    assert [c[1] for c in calls] == list(range(5000, 5008))
    assert [r["pair_clean"] for r in req["runs"]] == [True, True, False, False] + [True] * 4
    assert req["comparison"]["pairs"] == 3 and req["comparison"]["pairs_run"] == 4
    # retries run out: the verdict says so
    calls.clear()
    req = asyncio.run(rq.crosscheck(_load(seed=5000, num_prompts=4), repeats=3, retries=0))
    assert len(calls) == 6 and req["comparison"]["pairs"] == 2
    assert req["comparison"]["within_10pct"] is False
    with pytest.raises(BenchError, match="multiple of --concurrency"):
        asyncio.run(rq.crosscheck(_load(num_prompts=6, concurrency=4)))


def test_fresh_seeds_leave_room_for_the_runs() -> None:
    seeds = {rq.fresh_seed() for _ in range(20)}
    assert len(seeds) > 1 and all(s % 1000 == 0 and s > 0 for s in seeds)


def test_find_tokenizer(tmp_path: Path) -> None:
    assert find_tokenizer(str(tmp_path / "none")) is None
    m = tmp_path / "models" / "qwen"
    m.mkdir(parents=True)
    (m / "tokenizer_config.json").write_text("{}")
    (m / "config.json").write_text("{}")
    assert find_tokenizer(str(tmp_path)) == str(m)


def test_ours_run_sends_the_dataset_as_vllm_would() -> None:
    from tests.unit.bench.test_agents_harness import FakeServer, httpx

    server = FakeServer()
    seen: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.perf_counter())
        return await server(request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    data = [{"prompt": f"prompt {i}", "prompt_len": 2, "output_len": 64} for i in range(4)]
    load = _load(num_prompts=4, concurrency=2, output_len=64, seed=42)
    run = asyncio.run(rq._ours_run(load, data, None, http))
    warm, *sent = server.bodies
    assert warm["max_tokens"] == 1  # the warm-up, before the timed run
    # then the engine is left idle, as vLLM's bench leaves it, before the first wave
    assert seen[1] - seen[0] >= rq.IDLE_BEFORE_RUN_S
    assert sorted(b["messages"][0]["content"] for b in sent) == [d["prompt"] for d in data]
    for b in sent:  # one user message, vLLM's sampling and length, streamed with usage
        assert len(b["messages"]) == 1 and b["messages"][0]["role"] == "user"
        assert b["temperature"] == 0.0 and b["max_tokens"] == 64 and b["ignore_eos"] is True
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    assert len(run["rows"]) == 4 and run["figures"]["completed"] == 4
    assert run["figures"]["output_tokens"] == 20  # the fake server's 5 per request
    with pytest.raises(BenchError, match="output lengths"):
        asyncio.run(rq._ours_run(load, [d | {"output_len": 9} for d in data], None, http))


def test_ours_run_warms_the_pool_it_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's bench sends its test request and its main run through one aiohttp session, so
    its first wave starts with one warm connection; ours must too (one client, both)."""
    import openai

    from tests.unit.bench.test_agents_harness import FakeServer, httpx

    server = FakeServer()
    made: list[Any] = []

    def pool() -> Any:
        made.append(httpx.AsyncClient(transport=httpx.MockTransport(server)))
        return made[-1]

    monkeypatch.setattr(openai, "DefaultAsyncHttpxClient", pool)
    monkeypatch.setattr(rq, "IDLE_BEFORE_RUN_S", 0.0)
    data = [{"prompt": f"prompt {i}", "prompt_len": 2, "output_len": 64} for i in range(4)]
    load = _load(num_prompts=4, concurrency=2, output_len=64, seed=42)
    load.base_url = "http://127.0.0.1:9/v1"  # the scrapes find nothing there
    run = asyncio.run(rq._ours_run(load, data, None, None))
    assert len(made) == 1  # one pool: the warm-up's connection is the run's
    warm, *sent = server.bodies
    assert warm["max_tokens"] == 1 and len(sent) == 4
    assert run["figures"]["completed"] == 4
    assert made[0].is_closed  # closed with the run's target
