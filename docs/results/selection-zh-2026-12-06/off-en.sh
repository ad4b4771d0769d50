#!/bin/bash
# after after.sh: the "off" arm (given, nothing on) in English, the same day, for the rule
set -u; cd /work/main; S5=/work/scratch/s5
while pgrep -f "s5/after.sh" >/dev/null; do sleep 5; done
bash docs/results/models-2026-12-05/session4/serve.sh offline:qwen2.5-coder-0.5b-instruct 8472 $S5/serve-off.log &
for i in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:8472/health && break; sleep 2; done
$S5/sel2.sh 8472 $S5/off-en en given given
pkill -f "loopstack serve"
