"""Third pass (#57): diagnostic probes of the validation's two misses. Nothing here is
adopted by the model: each probe varies one condition and prints what it does, and the
last three solve for what a held-out figure would need (diagnosis only, never a fit).

Run from the repository root (~2 min on the 2-core box; its output: third_pass_probes.txt):
``.venv/bin/python docs/results/plan-gpu-2026-12-07/third_pass_probes.py``
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from typing import Any

from loopstack.bench.load.architecture import load_architecture
from loopstack.bench.load.enginesim import max_entropy_lengths, simulate
from loopstack.bench.load.hardware import get_hardware
from loopstack.bench.load.published import DEFAULT_TABLE, engines, predict_offline
from loopstack.bench.load.roofline import ReplicaSpec, fit_coefficients

Engine = Any  # loopstack.bench.load.published's engine (private there)

RUNS = {r["id"]: r for r in json.loads(DEFAULT_TABLE.read_text())["runs"]}
C = fit_coefficients()
H100_OFF, L40S_OFF = "mlperf51-h100-llama31-8b-offline", "mlperf51-l40s-llama31-8b-offline"
TARGET = {H100_OFF: 44.78, L40S_OFF: 12.73}


def ours(rid: str) -> Engine:
    return engines(RUNS[rid], C)[0]


def horizon() -> None:
    print("## 1. MLPerf Server over its minimum run duration (600 s) instead of 1,500 requests")
    for rid, sat in (("mlperf51-h100-llama31-8b-server", 54.86),
                     ("mlperf51-l40s-llama31-8b-server", 16.24)):  # fmt: skip
        for frac in (0.8, 0.88, 0.94, 0.98):
            rate = sat * frac
            st = simulate(ours(rid).sim(), 778, 129, mode="poisson", n=int(rate * 600), rate=rate)
            print(f"{rid}: {rate:.2f} q/s ({frac:.0%} of the simulated Offline rate): TTFT p99 "
                  f"{st.p('ttft', 99):.2f} s, TPOT p99 {st.p('tpot', 99) * 1e3:.1f} ms, "
                  f"mean {st.mean('tpot') * 1e3:.1f} ms")  # fmt: skip


def truncated_geometric(mean: float, cap: int, n: int, seed: int = 0) -> list[int]:
    """EOS at a constant rate h a token, cut at the cap; h solves the mean."""
    lo, hi = 1e-9, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - (1 - mid) ** cap) / mid > mean else (lo, mid)
    rng, out = random.Random(seed), []
    for _ in range(n):
        k = 1
        while k < cap and rng.random() >= lo:
            k += 1
        out.append(k)
    return out


def lengths() -> None:
    print("\n## 2. RTX 4090 sweep: TTFT under two output-length spreads (same cap, same mean)")
    for c in (4, 8, 16, 32, 48):
        r = RUNS[f"rtx4090-mistral7b-c{c}"]
        wl, m = r["workload"], r["measured"]
        mean = wl["output_tokens"]
        for name, outs in (("max-entropy", max_entropy_lengths(mean, 128, 300)),
                           ("trunc-geometric", truncated_geometric(mean, 128, 300))):  # fmt: skip
            st = simulate(ours(r["id"]).sim(), 256, 100, mode="closed", n=300, concurrency=c,
                          outputs=outs)  # fmt: skip
            print(f"C={c} {name}: at the cap {outs.count(128) / 300:.0%}, mean "
                  f"{statistics.fmean(outs):.1f}; TTFT mean {st.mean('ttft') * 1e3:.0f} ms "
                  f"(measured {m['ttft_mean_s'] * 1e3:.0f}), median {st.median('ttft') * 1e3:.0f} "
                  f"(measured {m['ttft_median_s'] * 1e3:.0f})")  # fmt: skip


def solve(rid: str, make, lo: float, hi: float, rising: bool) -> float:
    """Bisect the knob until the simulated Offline rate meets the published one."""
    for _ in range(12):
        mid = (lo + hi) / 2
        rate = predict_offline(make(mid), RUNS[rid]["workload"])["max_rate"] or 0.0
        faster = rate > TARGET[rid]
        lo, hi = (mid, hi) if faster == rising else (lo, mid)
    return (lo + hi) / 2


def needs() -> None:
    print("\n## 3. What the Offline rates would need (held-out figures: diagnosis, not a fit)")
    for rid in (H100_OFF, L40S_OFF):
        e, run = ours(rid), RUNS[rid]
        spec = ReplicaSpec(get_hardware(run["hardware"]), load_architecture(run["model"]), 1,
                           run["weights"], run["kv"])  # fmt: skip

        def per_seq(x: float, e: Engine = e) -> Engine:
            return replace(e, step=lambda b: e.step(b) + x * (b.decode_seqs + b.prefill_seqs))

        def kv_eff(x: float, e: Engine = e, spec: ReplicaSpec = spec) -> Engine:
            k = spec.kv_bytes_per_token / spec.hardware.mem_bw * (1 / x - 1 / C.bandwidth_eff)
            return replace(e, step=lambda b: e.step(b) + k * (
                b.decode_context + b.prefill_kv_read + b.prefill_tokens))  # fmt: skip

        def prompt(x: float, rid: str = rid) -> Engine:
            RUNS[rid]["workload"]["input_tokens"] = x
            return ours(rid)

        base = predict_offline(e, run["workload"])["max_rate"] or 0.0
        print(f"{rid}: simulated {base:.2f} q/s, published {TARGET[rid]} q/s; to meet it:")
        cpu = solve(rid, per_seq, 0, 2e-4, True)
        print(f"  a CPU cost a running sequence a step: {cpu * 1e6:.1f} us")
        print(
            f"  or KV reads at {solve(rid, kv_eff, 0.05, C.bandwidth_eff, False):.3f} x the "
            f"bandwidth (weights: {C.bandwidth_eff})"
        )
        tokens = solve(rid, prompt, 778, 2000, True)
        print(f"  or a mean prompt of {tokens:.0f} tokens (assumed 778)")
        RUNS[rid]["workload"]["input_tokens"] = 778


if __name__ == "__main__":
    horizon()
    lengths()
    needs()
