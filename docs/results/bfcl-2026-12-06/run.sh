#!/bin/bash
# run.sh PORT OUT SETS ARMS: the BFCL sample (40 of each set) against a served model
PORT=$1 OUT=$2 SETS=$3 ARMS=$4
cd /work/main
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 3000 .venv/bin/loopstack bench agent bfcl --base-url http://127.0.0.1:$PORT/v1 \
  --api-key test-key-123 --sets $SETS --n 40 --arms $ARMS --concurrency 3 --out $OUT > $OUT.jsonl 2> $OUT.err
echo "$(date +%T) bfcl $SETS $ARMS rc=$? in $(( $(date +%s) - t )) s" >> $OUT.timing
