#!/bin/bash
# svc.sh PORT OUT: the 10 customer-service tasks (5 en, 5 zh), code of /work/main
PORT=$1; OUT=$2; shift 2
cd /work/main
t=$(date +%s)
env "$@" LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench golden run --base-url http://127.0.0.1:$PORT/v1 \
  --api-key test-key-123 --set service --concurrency 3 --out $OUT > $OUT.log 2>&1
rc=$?
echo "$(date +%T) $OUT rc=$rc in $(( $(date +%s) - t )) s $*" >> /work/scratch/m46b/timing.txt
