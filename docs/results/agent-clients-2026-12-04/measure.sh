#!/usr/bin/env bash
# The prefix-cache measurement (measure_prefix.py) against a fresh `loopstack serve` with its
# defaults (the offline 0.5B, CPU, 32k context). Run from the repository root, under the lock:
#   flock /tmp/loopstack-heavy.lock timeout 590 docs/results/agent-clients-2026-12-04/measure.sh OUT
set -euo pipefail
here=docs/results/agent-clients-2026-12-04
out=${1:-$here/prefix-cache.jsonl}
body=$(mktemp --suffix=.json)
.venv/bin/python $here/capture_claude.py "$body"
port=18230
LOOPSTACK_PORT=$port LOOPSTACK_ENGINE_PORT=$((port + 1)) LOOPSTACK_API_KEY=measure \
  HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python -m loopstack serve > "${out%.jsonl}-server.txt" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$body"' EXIT
started=$(date +%s)
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  kill -0 $server 2>/dev/null || { tail -20 "${out%.jsonl}-server.txt"; exit 1; }
  sleep 2
done
echo "{\"server_ready_s\": $(( $(date +%s) - started )), \"date\": \"$(date -u +%FT%TZ)\", \"nproc\": $(nproc)}" > "$out"
.venv/bin/python $here/measure_prefix.py "http://127.0.0.1:$port" measure "$body" | tee -a "$out"
