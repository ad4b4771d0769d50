#!/bin/bash
# sel530.sh PORT OUT: selection at 5 and 30 tools against a running server (shipped defaults)
PORT=$1; OUT=$2; mkdir -p $OUT
cd /work/main
URL=http://127.0.0.1:$PORT/v1
t=$(date +%s)
timeout 2400 .venv/bin/loopstack bench agent selection --base-url $URL --api-key test-key-123 \
  --sizes 5 --items 6 --arms given,reversed,shuffled,ranked,top3 --no-abstention --concurrency 3 \
  --out $OUT/s5 > $OUT/s5.jsonl 2> $OUT/s5.err
echo "$(date +%T) $OUT s5 rc=$? in $(( $(date +%s) - t )) s" >> /work/scratch/m46b/timing.txt
t=$(date +%s)
timeout 2400 .venv/bin/loopstack bench agent selection --base-url $URL --api-key test-key-123 \
  --sizes 30 --items 1 --arms given,ranked,top3 --no-abstention --concurrency 3 \
  --out $OUT/s30 > $OUT/s30.jsonl 2> $OUT/s30.err
echo "$(date +%T) $OUT s30 rc=$? in $(( $(date +%s) - t )) s" >> /work/scratch/m46b/timing.txt
