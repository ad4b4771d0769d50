#!/usr/bin/env bash
# One locked measurement: serve MODEL on PORT, run the selection bench with ARGS, stop.
# Usage (from the repo root, under the shared lock):
#   flock /tmp/loopstack-heavy.lock timeout 600 docs/results/models-2026-12-04/measure.sh \
#     offline:qwen2.5-coder-0.5b-instruct OUTDIR --sizes 10 --items 0 --arms ... --abstention-arms ...
set -u
MODEL=$1; OUT=$2; shift 2
PORT=${PORT:-8460}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$PWD
procs() { echo "$1"; for c in $(ps -o pid= --ppid "$1"); do procs "$c"; done; }
tree_rss_kb() { local t=0 r; for p in $(procs "$1"); do r=$(ps -o rss= -p "$p"); t=$((t + ${r:-0})); done; echo $t; }
t0=$(date +%s)
LOOPSTACK_MODEL=$MODEL LOOPSTACK_PORT=$PORT .venv/bin/loopstack serve > "$OUT/serve.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null' EXIT TERM INT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $srv 2>/dev/null || { echo "server died"; tail -20 "$OUT/serve.log"; exit 1; }
  sleep 2
done
t1=$(date +%s)
echo "ready_s=$((t1 - t0))" | tee "$OUT/timing.txt"
( while kill -0 $srv 2>/dev/null; do echo "$(date +%T) rss_kb=$(tree_rss_kb $srv)" >> "$OUT/rss.txt"; sleep 20; done ) &
.venv/bin/loopstack bench agent selection --base-url "http://127.0.0.1:$PORT/v1" --out "$OUT" "$@" \
  > "$OUT/stdout.jsonl" 2> "$OUT/stderr.log"
echo "bench_rc=$? bench_s=$(( $(date +%s) - t1 ))" | tee -a "$OUT/timing.txt"
