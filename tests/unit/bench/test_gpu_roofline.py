"""The GPU replica model's roofline terms against hand arithmetic: one dense architecture
(Llama-3.1-8B) and one MoE (Qwen3-30B-A3B), from their shipped config.json figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopstack.bench.load import BenchError
from loopstack.bench.load.architecture import load_architecture
from loopstack.bench.load.hardware import get_hardware
from loopstack.bench.load.roofline import (
    Batch,
    Coefficients,
    ReplicaSpec,
    fit_coefficients,
    step_terms,
    touched_experts,
)

IDEAL = Coefficients(compute_eff=1.0, bandwidth_eff=1.0)


def test_dense_parameter_counts_by_hand() -> None:
    a = load_architecture("meta-llama/Llama-3.1-8B-Instruct")
    # q and o: 4096 x 4096 each; k and v: 4096 x (8 x 128) each
    assert a.attention_params == 2 * 4096 * 4096 + 2 * 4096 * 1024 == 41_943_040
    assert a.dense_mlp_params == 3 * 4096 * 14336 == 176_160_768
    assert a.layer_params() == 32 * (41_943_040 + 176_160_768) == 6_979_321_856
    assert a.total_params == 6_979_321_856 + 2 * 128256 * 4096 == 8_029_995_008  # "8B"
    assert a.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB, issue #57


def test_moe_parameter_counts_by_hand() -> None:
    a = load_architecture("Qwen/Qwen3-30B-A3B")
    assert a.is_moe and a.experts == 128 and a.experts_per_token == 8 and a.moe_layers == 48
    assert a.attention_params == 2048 * 4096 * 2 + 2 * 2048 * 512 == 18_874_368
    assert a.expert_params == 3 * 2048 * 768 == 4_718_592
    per_layer = 18_874_368 + 128 * 4_718_592 + 2048 * 128
    assert a.layer_params() == 48 * per_layer == 29_909_581_824
    assert a.total_params == 29_909_581_824 + 2 * 151936 * 2048 == 30_531_911_680  # "30B"
    active = 48 * (18_874_368 + 8 * 4_718_592 + 2048 * 128) + 151936 * 2048
    assert a.active_params == active == 3_041_656_832  # "A3B"
    assert a.kv_bytes_per_token(2) == 2 * 48 * 4 * 128 * 2 == 98_304


def test_dense_decode_step_by_hand() -> None:
    a = load_architecture("meta-llama/Llama-3.1-8B-Instruct")
    spec = ReplicaSpec(get_hardware("h100"), a)
    t = step_terms(spec, IDEAL, Batch(decode_seqs=1, decode_context=1000))
    flops = 2 * 6_979_321_856 + 2 * 525_336_576  # layers + LM head, one token
    weights = (6_979_321_856 + 525_336_576) * 2  # bf16, no embedding table
    kv = 131_072 * 1000
    want = flops / 989.4e12 + weights / 3.35e12 + kv / 3.35e12  # attention: its bytes bind
    assert t.total_s == pytest.approx(want, rel=1e-9)
    assert weights / 3.35e12 == pytest.approx(4.48e-3, rel=1e-3)  # the issue's ~4.8 ms floor
    assert t.bound == "memory bandwidth"


def test_prefill_is_compute_and_tp_splits_it() -> None:
    a = load_architecture("meta-llama/Llama-3.1-8B-Instruct")
    one = ReplicaSpec(get_hardware("h100"), a)
    two = ReplicaSpec(get_hardware("h100"), a, tp=2)
    b = Batch(0, 0, prefill_tokens=4096, prefill_context=4096 * 2048, prefill_seqs=1)
    t1, t2 = step_terms(one, IDEAL, b), step_terms(two, IDEAL, b)
    assert t1.bound == "compute"
    assert t2.compute_s == pytest.approx(t1.compute_s / 2)
    # ring all-reduce, 2 a layer: 2 (tp-1)/tp x 4096 x 4096 x 2 bytes over 450 GB/s + 8 us
    comm = 2 * 32 * (2 * 0.5 * 4096 * 4096 * 2 / 450e9 + 8e-6)
    assert t2.comm_s == pytest.approx(comm)


def test_moe_reads_only_the_experts_a_batch_touches() -> None:
    a = load_architecture("Qwen/Qwen3-30B-A3B")
    assert touched_experts(a, 1) == pytest.approx(8)
    assert touched_experts(a, 16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    spec = ReplicaSpec(get_hardware("h100"), a)
    t = step_terms(spec, IDEAL, Batch(1, 0))
    dense = 48 * (18_874_368 + 2048 * 128)  # attention + router, every layer
    weights = (dense + 48 * 8 * 4_718_592 + 151936 * 2048) * 2
    flops = 2 * a.active_params
    assert t.total_s == pytest.approx(flops / 989.4e12 + weights / 3.35e12, rel=1e-9)
    big = step_terms(spec, IDEAL, Batch(256, 0))
    assert big.memory_s < 128 * 4_718_592 * 48 * 2 / 3.35e12 * 1.2  # at most every expert


def test_kv_capacity_by_hand() -> None:
    a = load_architecture("Qwen/Qwen3-8B")
    spec = ReplicaSpec(get_hardware("h100"), a)
    free = 80e9 * 0.9 - 2e9 - a.total_params * 2
    assert spec.kv_capacity_tokens() == int(free / (2 * 36 * 8 * 128 * 2))
    fp8 = ReplicaSpec(get_hardware("l40s"), a, weights="fp8", kv="fp8")
    assert fp8.kv_capacity_tokens() == int((48e9 * 0.9 - 2e9 - a.total_params) / (36 * 8 * 128 * 2))


def test_a_local_config_json_is_read(tmp_path: Path) -> None:
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 100, "intermediate_size": 128, "num_key_value_heads": 2}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = load_architecture(str(tmp_path))
    assert (a.head_dim, a.kv_heads, a.layers) == (16, 2, 2)
    assert a.total_params == 2 * (64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128) + 2 * 100 * 64


def test_unknown_model_and_hardware_are_clear_errors() -> None:
    with pytest.raises(BenchError, match=r"no config\.json"):
        load_architecture("nobody/NoSuchModel-1B")
    with pytest.raises(BenchError, match="unknown hardware"):
        get_hardware("tpu-v9")
    assert get_hardware("H100-SXM").name == get_hardware("h100").name


def test_fit_uses_only_its_named_sources() -> None:
    c = fit_coefficients()
    # BLIS beta1 17.25 us a prefill token vs the ideal H100 bf16 cost (about 14.1 us + attention)
    assert 0.7 < c.compute_eff < 0.95
    # 75 tok/s on an A100 40GB: 13.3 ms a token against a ~9.8 ms ideal read
    assert 0.65 < c.bandwidth_eff < 0.8
    assert 1.0 < c.fp8_speedup < 2.0
    assert "A100 40GB" in c.fitted_on and "BLIS" in c.fitted_on
