#!/bin/bash
# run.sh PORT OUT: the six arms of RULE.md, the same hour, against a served 0.5B on PORT
PORT=$1 OUT=$2
cd /work/main && mkdir -p $OUT
ARMS=given,defaults,given+abstain,ranked+abstain,top5+abstain,top5+floor0.15+abstain
B=".venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 --sizes 10 --concurrency 3 --seed 7"
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 2400 $B --lang en --items 6 --arms $ARMS --abstention-arms $ARMS \
  --out $OUT/items > $OUT/items.jsonl 2> $OUT/items.err
echo "$(date +%T) items+abstention rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 1800 $B --everyday --arms $ARMS --no-abstention \
  --out $OUT/everyday > $OUT/everyday.jsonl 2> $OUT/everyday.err
echo "$(date +%T) everyday rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing
