#!/bin/bash
# rep.sh PORT OUTPREFIX N: the 0.5B's shipped defaults and the full ranked list, English, N times
PORT=$1 P=$2 N=$3
cd /work/main
for i in $(seq 1 $N); do
  t=$(date +%s)
  HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench agent selection --base-url http://127.0.0.1:$PORT/v1 --api-key test-key-123 \
    --lang en --sizes 10 --items 6 --arms defaults,ranked --abstention-arms defaults --concurrency 3 --out $P-$i > $P-$i.jsonl 2> $P-$i.err
  echo "$(date +%T) $P-$i rc=$? in $(( $(date +%s) - t )) s" >> $P.timing
done
