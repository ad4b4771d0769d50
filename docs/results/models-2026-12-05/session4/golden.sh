#!/bin/bash
# golden.sh MODEL OUT [SET] [ENV=value ...]: serve MODEL (env overrides), run a golden set, stop.
MODEL=$1 OUT=$2 SET=${3:-golden}; shift 3
set -u; mkdir -p $OUT; cd /work/main
PORT=8460; URL=http://127.0.0.1:$PORT/v1; KEY=test-key-123; T=$OUT/timing.txt
/work/scratch/m47/serve.sh $MODEL $PORT $OUT/serve.log "$@" &
S=$!; t0=$(date +%s)
for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break; sleep 2; done
echo "$(date +%T) ready after $(( $(date +%s) - t0 )) s" >> $T
t=$(date +%s)
LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench golden run \
  --base-url $URL --api-key $KEY --set $SET --concurrency 3 --out $OUT/golden > $OUT/golden.log 2>&1
echo "$(date +%T) golden rc=$? in $(( $(date +%s) - t )) s" >> $T
kill $S; wait $S 2>/dev/null
