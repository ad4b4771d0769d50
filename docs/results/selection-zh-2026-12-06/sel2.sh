#!/bin/bash
# sel2.sh PORT OUT LANG SEL_ARMS ABST_ARMS
PORT=$1 OUT=$2 LANG_=$3 ARMS=$4 AARMS=$5
cd /work/main
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 2400 .venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 \
  --lang $LANG_ --sizes 10 --items 6 --arms $ARMS \
  --abstention-arms $AARMS --concurrency 3 --out $OUT > $OUT.jsonl 2> $OUT.err
echo "$(date +%T) sel $LANG_ rc=$? in $(( $(date +%s) - t )) s" >> $OUT.timing
