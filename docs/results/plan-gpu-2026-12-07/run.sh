#!/usr/bin/env bash
# The GPU fleet plan of docs/benchmarks.md ("GPU fleet plan, modelled"), issue #57.
# MODELLED figures only: no GPU was available to this project; nothing here ran on one.
# Run from the repository root: bash docs/results/plan-gpu-2026-12-07/run.sh
set -euo pipefail
out=docs/results/plan-gpu-2026-12-07
for hw in h100 h200 l40s; do
  for n in 100 500 2000; do
    .venv/bin/loopstack bench plan --hardware "$hw" --model Qwen/Qwen3-8B --tp 1 \
      --agents "$n" --slo-p95-step 10s --gpu-cost-per-hour 1 > "$out/plan-$hw-$n.txt"
  done
done
# a long-context agent (long-agents.yaml), where the KV cache binds: 500 agents, p95 <= 30 s
for hw in h100 h200 l40s; do
  .venv/bin/loopstack bench plan --hardware "$hw" --model Qwen/Qwen3-8B --tp 1 --agents 500 \
    --slo-p95-step 30s --workload "$out/long-agents.yaml" > "$out/plan-long-$hw-500.txt"
done
# the KV cliff: hit rate and p95 step against agents a replica, H100 / H200 / L40S
.venv/bin/python -m loopstack.bench.load.gpuplan --cliff-plot "$out/kv-cliff.png" --model Qwen/Qwen3-8B \
  --hardware h100,h200,l40s --top 1000 --slo-p95-step-s 10
# the validation against published runs, per figure (markdown)
.venv/bin/python -m loopstack.bench.load.published > "$out/validation.md"
