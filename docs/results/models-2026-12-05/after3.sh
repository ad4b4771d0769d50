#!/bin/bash
# golden (39 tasks) with the selection defaults under test: the 1.5B as shipped now (the
# abstention rule), the 0.5B with LOOPSTACK_TOOL_ABSTAIN=1 (a candidate)
while [ ! -f /work/scratch/m46/after2.done ]; do sleep 10; done
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
g() {  # g MODEL OUT [ENV...]
  local MODEL=$1 OUT=$2; shift 2; mkdir -p $OUT
  env "$@" LOOPSTACK_MODEL=$MODEL LOOPSTACK_API_KEY=test-key-123 LOOPSTACK_PORT=8460 .venv/bin/loopstack serve > $OUT/serve.log 2>&1 &
  local S=$!
  for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:8460/health && break; sleep 2; done
  local t=$(date +%s)
  LOOPSTACK_AGENT_WALL_CLOCK_S=900 .venv/bin/loopstack bench golden run --base-url http://127.0.0.1:8460/v1 \
    --api-key test-key-123 --concurrency 3 --out $OUT/run > $OUT/golden.log 2>&1
  local rc=$?
  echo "$(date +%T) golden $OUT rc=$rc in $(( $(date +%s) - t )) s" >> /work/scratch/m46/after.timing
  kill $S; wait $S
}
g offline:qwen2.5-coder-1.5b-instruct /work/scratch/m46/g15-abstain
g offline:qwen2.5-coder-0.5b-instruct /work/scratch/m46/g05-abstain LOOPSTACK_TOOL_ABSTAIN=1
echo done > /work/scratch/m46/after3.done
