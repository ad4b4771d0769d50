#!/bin/bash
# redecide.sh PORT OUT: off / shipped / ranked list + rule, the same hour, on the 18 items + the
# abstention set (10 tools) and the 24 everyday wordings (10 tools)
PORT=$1 OUT=$2
cd /work/main
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 \
  --lang en --sizes 10 --items 6 --arms given,defaults,ranked+abstain --abstention-arms given,defaults,ranked+abstain \
  --concurrency 3 --out $OUT/items > $OUT/items.jsonl 2> $OUT/items.err
echo "$(date +%T) items rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 \
  --everyday --sizes 10 --arms given,defaults,ranked+abstain --no-abstention \
  --concurrency 3 --out $OUT/everyday > $OUT/everyday.jsonl 2> $OUT/everyday.err
echo "$(date +%T) everyday rc=$? in $(( $(date +%s) - t )) s" >> $OUT/timing
