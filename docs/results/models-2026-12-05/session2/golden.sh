#!/bin/bash
# golden.sh PORT OUT [env...]: the golden set (39 tasks) against a running server
PORT=$1; OUT=$2; shift 2
cd /work/main
t=$(date +%s)
env "$@" LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 2400 .venv/bin/loopstack bench golden run --base-url http://127.0.0.1:$PORT/v1 \
  --api-key test-key-123 --concurrency 3 --out $OUT > $OUT.log 2>&1
rc=$?
echo "$(date +%T) $OUT rc=$rc in $(( $(date +%s) - t )) s $*" >> /work/scratch/m46b/timing.txt
