#!/bin/bash
# One server (the shipped default), one agent for 4 tasks, py-spy on our server and the engine core;
# then a sweep 1,4,8,12,16 for the plan's hold-out check (fit 1,4,8 -> 12,16).
set -u
OUT=/work/scratch/spin/${1:-profile}; mkdir -p $OUT
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
KEY=test-key-123
env ${ARM_ENV:-} LOOPSTACK_API_KEY=$KEY LOOPSTACK_PORT=8000 .venv/bin/loopstack serve > $OUT/serve.log 2>&1 &
A=$!
for i in $(seq 600); do curl -sf -o /dev/null http://127.0.0.1:8000/health && break; sleep 2; done
echo "ready $(date)"
CORE=$(pgrep -f "VLLM::EngineCore" | head -1); API=$(pgrep -f "vllm.entrypoints.openai.api_server" | head -1)
ps -eo pid,args | grep -E "VLLM|loopstack serve|api_server" | grep -v grep > $OUT/procs.txt
.venv/bin/loopstack bench agents --api-key $KEY --agents 1 --tasks-per-agent 1 --out $OUT/warm > /dev/null 2>&1
.venv/bin/python /work/scratch/spin/cpu.py $A > $OUT/cpu-before.json
/tmp/spy/bin/py-spy record -p $A -r 50 -f raw -o $OUT/ours.txt --nonblocking -d 60 > $OUT/spy-ours.log 2>&1 &
S1=$!
/tmp/spy/bin/py-spy record -p $CORE -r 50 -f raw -o $OUT/core.txt --native --nonblocking -d 60 > $OUT/spy-core.log 2>&1 &
S2=$!
/tmp/spy/bin/py-spy record -p $API -r 50 -f raw -o $OUT/api.txt --nonblocking -d 60 > $OUT/spy-api.log 2>&1 &
S3=$!
.venv/bin/loopstack bench agents --api-key $KEY --agents 1 --tasks-per-agent 6 --out $OUT/one > $OUT/one.log 2>&1
wait $S1 $S2 $S3; sleep 1
.venv/bin/python /work/scratch/spin/cpu.py $A > $OUT/cpu-after.json
if [ -z "${NO_SWEEP:-}" ]; then
  .venv/bin/loopstack bench agents --api-key $KEY --agents 1,4,8,12,16 --tasks-per-agent 2 --prewarm --out $OUT/sweep > $OUT/sweep.log 2>&1
  echo "sweep rc=$? $(date)"
fi
kill $A; wait
echo "done $(date)"
