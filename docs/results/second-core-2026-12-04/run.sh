#!/bin/bash
# Two servers, interleaved per level by `loopstack bench agents --baseline-url`:
#   ours (8000) = ARM_ENV, baseline (8010) = vLLM-CPU as shipped (MP executor).
set -u
NAME=$1; shift            # result folder name
ARM_ENV="$*"              # env for the arm under test
OUT=/work/scratch/spin/$NAME; mkdir -p $OUT
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
KEY=test-key-123
env $ARM_ENV LOOPSTACK_API_KEY=$KEY LOOPSTACK_PORT=8000 .venv/bin/loopstack serve > $OUT/arm.serve.log 2>&1 &
A=$!
sleep 5
env ${BASE_ENV:-} LOOPSTACK_API_KEY=$KEY LOOPSTACK_PORT=8010 .venv/bin/loopstack serve > $OUT/base.serve.log 2>&1 &
B=$!
for port in 8000 8010; do
  for i in $(seq 600); do curl -sf -o /dev/null http://127.0.0.1:$port/health && break; sleep 2; done
done
echo "ready $(date)"
.venv/bin/python /work/scratch/spin/cpu.py $A $B > $OUT/cpu-before.json
lscpu > $OUT/lscpu.txt
.venv/bin/loopstack bench agents --base-url http://127.0.0.1:8000/v1 --api-key $KEY \
  --baseline-url http://127.0.0.1:8010/v1 --baseline-api-key $KEY \
  --agents ${AGENTS:-1,4,8,16} --tasks-per-agent ${TASKS:-2} --prewarm --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$? $(date)"
.venv/bin/python /work/scratch/spin/cpu.py $A $B > $OUT/cpu-after.json
kill $A $B; wait
echo "done $(date)"
