#!/bin/bash
# norule/run.sh PORT OUT: off, the shipped set and top 5 + floor 0.15 without the rule, the same
# hour, on the 18 items + abstention set, the 24 everyday and the 24 held-out wordings (10 tools)
PORT=$1 OUT=$2
cd /work/main && mkdir -p $OUT
ARMS=given,defaults,top5+floor0.15
B=".venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 --sizes 10 --concurrency 3 --seed 7"
D=docs/results/selection-redecide-2026-12-06
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 1800 $B --lang en --items 6 --arms $ARMS --abstention-arms $ARMS --out $OUT/items > $OUT/items.jsonl 2> $OUT/items.err
echo "$(date +%T) items rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing; t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 900 $B --everyday --arms $ARMS --no-abstention --out $OUT/everyday > $OUT/everyday.jsonl 2> $OUT/everyday.err
echo "$(date +%T) everyday rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing; t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 900 $B --everyday-file $D/heldout/everyday_heldout.json --arms $ARMS --no-abstention --out $OUT/heldout > $OUT/heldout.jsonl 2> $OUT/heldout.err
echo "$(date +%T) heldout rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing
