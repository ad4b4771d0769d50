#!/bin/bash
# sel.sh PORT OUT LANG: the selection bench at 10 tools in LANG (zh: 24 items; en: 12 golden + 6 corpus)
PORT=$1 OUT=$2 LANG_=$3
cd /work/main
ITEMS=6
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 2400 .venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 \
  --lang $LANG_ --sizes 10 --items $ITEMS --arms given,given+abstain,ranked+abstain,top5+floor+abstain,defaults \
  --abstention-arms given,given+abstain,top5+floor+abstain,defaults --concurrency 3 --out $OUT > $OUT.jsonl 2> $OUT.err
echo "$(date +%T) sel $LANG_ rc=$? in $(( $(date +%s) - t )) s" >> $OUT.timing
