#!/usr/bin/env bash
# The 1.5B default on this box: start-up choice, Claude Code's first request admitted, the
# three-API test, one agent's step p95.
set -u
cd /work/main
OUT=${1:-docs/results/default-2026-12-07/out}; mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
lscpu > "$OUT/lscpu.txt"; free -g > "$OUT/free.txt"; uptime > "$OUT/uptime-start.txt"
LOOPSTACK_PORT=8020 LOOPSTACK_ENGINE_PORT=8021 LOOPSTACK_API_KEY=test-key-123 \
  LOOPSTACK_MODEL=offline:qwen2.5-coder-1.5b-instruct setsid .venv/bin/loopstack serve > "$OUT/server.log" 2>&1 &
echo $! > "$OUT/server.pid"
t0=$(date +%s)
until curl -fsS -m 5 localhost:8020/health >/dev/null 2>&1; do
  sleep 5; if (( $(date +%s) - t0 > 900 )); then echo "not healthy in 900 s"; exit 1; fi
done
echo "healthy after $(( $(date +%s) - t0 )) s" | tee "$OUT/ready.txt"
grep "CPU context" "$OUT/server.log" | tee "$OUT/context.txt"
curl -s -H "Authorization: Bearer test-key-123" localhost:8020/v1/models | tee "$OUT/models.json"; echo
