#!/bin/bash
# golden.sh MODEL OUT [SET]: serve MODEL on :8460 (shipped defaults), run the golden set, stop.
set -u
MODEL=$1; OUT=$2; SET=${3:-golden}
mkdir -p $OUT; cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
KEY=test-key-123
LOOPSTACK_MODEL=$MODEL LOOPSTACK_API_KEY=$KEY LOOPSTACK_PORT=8460 .venv/bin/loopstack serve > $OUT/serve.log 2>&1 &
S=$!
t0=$(date +%s)
for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:8460/health && break; sleep 2; done
echo "ready after $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
LOOPSTACK_AGENT_WALL_CLOCK_S=900 .venv/bin/loopstack bench golden run --base-url http://127.0.0.1:8460/v1 \
  --api-key $KEY --set $SET --concurrency ${CONC:-3} --out $OUT/run > $OUT/golden.log 2>&1
echo "golden rc=$? in $(( $(date +%s) - t1 )) s"
.venv/bin/loopstack bench agents --base-url http://127.0.0.1:8460/v1 --api-key $KEY --agents 1 \
  --tasks-per-agent 3 --prewarm --out $OUT/one-agent > $OUT/one-agent.log 2>&1
echo "one agent rc=$?"
kill $S; wait
