"""The iteration-level GPU replica simulator (`loopstack.bench.load.enginesim`) against hand
arithmetic, with step functions simple enough to follow by hand, and vLLM's per-GPU
scheduler defaults."""

from __future__ import annotations

import pytest

from loopstack.bench.load import BenchError
from loopstack.bench.load.architecture import load_architecture
from loopstack.bench.load.enginesim import Engine, max_entropy_lengths, simulate
from loopstack.bench.load.hardware import get_hardware
from loopstack.bench.load.roofline import Batch, ReplicaSpec, vllm_server_defaults


def flat(step_s: float, overhead_s: float = 0.0, budget: int = 2048, seqs: int = 256) -> Engine:
    return Engine(lambda b: step_s, lambda p: overhead_s, budget, seqs)


def test_one_request_by_hand() -> None:
    # sent at 0, reaches the engine after 2 ms; its prompt in one iteration samples token 1,
    # four more iterations give tokens 2-5
    st = simulate(flat(0.010, 0.002), 100, 5, mode="closed", n=1, concurrency=1)
    assert st.ttft == pytest.approx([0.012])
    assert st.e2e == pytest.approx([0.052])
    assert st.tpot == pytest.approx([0.010])
    assert st.iterations == 5


def test_a_long_prompt_is_chunked_at_the_token_budget() -> None:
    # 5,000 prompt tokens at 2,048 an iteration: 2,048 + 2,048 + 904, the first token at 3
    st = simulate(flat(0.010), 5000, 2, mode="closed", n=1)
    assert st.ttft == pytest.approx([0.030]) and st.e2e == pytest.approx([0.040])


def test_two_clients_share_the_budget_first_come_first_served() -> None:
    # budget 256: A's 200 tokens and B's first 56 in iteration 1; A's decode and B's last
    # 144 in iteration 2 (running requests go first); then both decode
    st = simulate(flat(0.010, budget=256), 200, 3, mode="closed", n=2, concurrency=2)
    assert sorted(st.ttft) == pytest.approx([0.010, 0.020])
    assert sorted(st.e2e) == pytest.approx([0.030, 0.040])


def test_the_batch_each_iteration_runs_by_hand() -> None:
    seen: list[Batch] = []

    def step(b: Batch) -> float:
        seen.append(b)
        return 0.01

    simulate(Engine(step, lambda p: 0.0, 256, 8), 300, 2, mode="closed", n=1)
    first, second, third = seen
    # chunk 1: 256 tokens attending to 128 on average; no token sampled; nothing cached read
    assert first == Batch(0, 0, 256, 256 * 128, 0, 0)
    # chunk 2: 44 tokens after 256, attending 256 + 22 each; it samples; reads 256 cached
    assert second == Batch(0, 0, 44, 44 * (256 + 22), 1, 256)
    # then one decode over the 300 prompt tokens and the one token generated
    assert third == Batch(1, 301, 0, 0, 0, 0)


def test_max_num_seqs_holds_a_request_back() -> None:
    # one sequence at a time: B starts when A ends; 2 requests over 40 ms
    st = simulate(flat(0.010, seqs=1), 10, 2, mode="offline", n=2)
    assert sorted(st.ttft) == pytest.approx([0.010, 0.030])
    assert st.makespan_s == pytest.approx(0.040) and st.throughput_rps == pytest.approx(50.0)


def test_the_kv_cache_holds_a_request_back() -> None:
    # room for 25 tokens: one request of 10 + 10 at a time
    e = Engine(lambda b: 0.010, lambda p: 0.0, 2048, 256, kv_tokens=25)
    st = simulate(e, 10, 10, mode="offline", n=2)
    assert sorted(st.ttft) == pytest.approx([0.010, 0.110])


def test_poisson_is_seeded_and_queues_under_load() -> None:
    e = flat(0.010)
    light = simulate(e, 100, 10, mode="poisson", n=400, rate=1.0, seed=3)
    # an idle engine starts a request at once; one arriving mid-iteration waits for its end
    assert light.median("ttft") == pytest.approx(0.010)
    assert 0.010 < light.mean("ttft") < 0.012
    again = simulate(e, 100, 10, mode="poisson", n=400, rate=1.0, seed=3)
    assert again.ttft == light.ttft
    # a step that grows with the batch: more load, longer iterations, higher TPOT
    grow = Engine(lambda b: 0.005 + 0.001 * (b.decode_seqs + b.prefill_seqs), lambda p: 0.0,
                  2048, 256)  # fmt: skip
    lo = simulate(grow, 100, 20, mode="poisson", n=400, rate=5.0)
    hi = simulate(grow, 100, 20, mode="poisson", n=400, rate=20.0)
    assert hi.mean("tpot") > lo.mean("tpot") > 0.005


def test_each_request_its_own_output_length() -> None:
    # A: 2 tokens (first at 10 ms, end at 20); B: 4 tokens (first at 10, end at 40)
    st = simulate(flat(0.010), 10, 99, mode="closed", n=2, concurrency=2, outputs=[2, 4])
    assert st.outputs == [2.0, 4.0]
    assert st.e2e == pytest.approx([0.020, 0.040]) and st.tpot == pytest.approx([0.010] * 2)


def test_max_entropy_lengths_by_hand() -> None:
    # on {1, 2} with mean 1.75: p(2) = 0.75, p(1) = 0.25 (the only distribution there)
    two = max_entropy_lengths(1.75, 2, 20_000, seed=1)
    assert two.count(2) / len(two) == pytest.approx(0.75, abs=0.01)
    # the middle of [1, 128] is the uniform distribution
    mid = max_entropy_lengths(64.5, 128, 20_000, seed=1)
    assert min(mid) == 1 and max(mid) == 128
    assert sum(mid) / len(mid) == pytest.approx(64.5, abs=0.7)
    # a mean near the cap leans on it; seeded
    hi = max_entropy_lengths(100.3, 128, 20_000, seed=2)
    assert sum(hi) / len(hi) == pytest.approx(100.3, abs=0.5) and max(hi) == 128
    assert hi.count(128) > hi.count(64) > hi.count(1)
    assert hi == max_entropy_lengths(100.3, 128, 20_000, seed=2)
    with pytest.raises(BenchError):
        max_entropy_lengths(130, 128, 10)


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(BenchError):
        simulate(flat(0.01), 0, 5, mode="closed", n=1)
    with pytest.raises(BenchError):
        simulate(flat(0.01), 10, 5, mode="poisson", n=1)
    with pytest.raises(BenchError):
        simulate(flat(0.01), 10, 5, mode="burst", n=1)
    with pytest.raises(BenchError):
        simulate(flat(0.01), 10, 5, mode="closed", n=1, outputs=[0])


def test_vllm_default_budget_and_seqs_by_gpu() -> None:
    assert vllm_server_defaults(get_hardware("h100")) == (8192, 1024)
    assert vllm_server_defaults(get_hardware("h200")) == (8192, 1024)
    for small in ("a100", "a100-40gb", "l40s", "rtx4090"):  # under 70 GiB, or an A100
        assert vllm_server_defaults(get_hardware(small)) == (2048, 256), small
    llama = load_architecture("meta-llama/Llama-3.1-8B-Instruct")
    spec = ReplicaSpec(get_hardware("l40s"), llama)
    assert (spec.token_budget, spec.max_seqs) == (2048, 256)
    assert ReplicaSpec(get_hardware("l40s"), llama, token_budget=4096).token_budget == 4096
