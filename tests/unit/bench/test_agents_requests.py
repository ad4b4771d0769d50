"""The vllm bench serve wrapper: its arguments, figures, the cross-check arithmetic."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench.load.requests import (
    RequestLoad,
    compare,
    crosscheck_scenario,
    find_tokenizer,
    pick_figures,
    vllm_args,
)


def test_vllm_args_match_the_load() -> None:
    load = RequestLoad(
        "http://h:8000/v1",
        "k",
        "m",
        "/tok",
        num_prompts=8,
        input_len=100,
        output_len=32,
        concurrency=2,
        request_rate=1.5,
        goodput_ttft_ms=500,
    )
    a = vllm_args(load, "/d", "f.json")
    kv = dict(itertools.pairwise(a))
    assert kv["--base-url"] == "http://h:8000" and kv["--endpoint"] == "/v1/chat/completions"
    assert kv["--backend"] == "openai-chat" and kv["--tokenizer"] == "/tok"
    assert kv["--random-input-len"] == "100" and kv["--random-output-len"] == "32"
    assert kv["--max-concurrency"] == "2" and kv["--num-prompts"] == "8"
    assert kv["--request-rate"] == "1.5" and kv["--goodput"] == "ttft:500"
    assert "--ignore-eos" in a and "k" not in a  # the key travels in the environment


def test_pick_figures_and_compare() -> None:
    raw = {
        "completed": 16,
        "output_throughput": 40.0,
        "mean_ttft_ms": 500.0,
        "median_ttft_ms": 400.0,
        "p99_itl_ms": 90.0,
        "input_lens": [1, 2],
        "date": "x",
    }
    figs = pick_figures(raw)
    assert figs == {
        "completed": 16,
        "output_throughput": 40.0,
        "mean_ttft_ms": 500.0,
        "median_ttft_ms": 400.0,
        "p99_itl_ms": 90.0,
    }
    ours = {"ttft_mean_s": 0.55, "ttft_p50_s": 0.42, "output_tok_s": 38.0}
    c = compare(figs, ours)
    assert c["ttft_mean_ratio"] == pytest.approx(1.1)
    assert c["ttft_median_ratio"] == pytest.approx(1.05)
    assert c["output_tok_s_ratio"] == pytest.approx(0.95)
    assert c["within_10pct"] is True
    assert compare(figs, ours | {"output_tok_s": 30.0})["within_10pct"] is False


def test_crosscheck_scenario_is_single_step_without_tools() -> None:
    sc = crosscheck_scenario(["a b", "c d"], 64)
    assert sc.tool_choice == "none" and not sc.tools and sc.system_prompt == ""
    assert [t.steps for t in sc.tasks] == [1, 1] and sc.max_tokens == 64
    assert sc.extra_body == {"ignore_eos": True}


def test_find_tokenizer(tmp_path: Path) -> None:
    assert find_tokenizer(str(tmp_path / "none")) is None
    m = tmp_path / "models" / "qwen"
    m.mkdir(parents=True)
    (m / "tokenizer_config.json").write_text("{}")
    (m / "config.json").write_text("{}")
    assert find_tokenizer(str(tmp_path)) == str(m)
