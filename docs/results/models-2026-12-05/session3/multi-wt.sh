#!/bin/bash
# multi-wt.sh PORT OUT [env...]: the multi set, code of the worktree /work/scratch/wt-rules
PORT=$1; OUT=$2; shift 2
cd /work/scratch/wt-rules
t=$(date +%s)
env "$@" LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 /work/main/.venv/bin/python -m loopstack bench golden run --base-url http://127.0.0.1:$PORT/v1 \
  --api-key test-key-123 --set ${SET:-multi} --concurrency 3 --out $OUT > $OUT.log 2>&1
rc=$?
echo "$(date +%T) $OUT rc=$rc in $(( $(date +%s) - t )) s wt-rules $*" >> /work/scratch/m46b/timing.txt
