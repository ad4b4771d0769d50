#!/bin/bash
# the 1.5B with the new ranker: selection at 10 tools (en), arms off / rule / ranked+rule / top5+floor+rule
set -u; cd /work/main; S5=/work/scratch/s5; T=$S5/timing.txt
bash docs/results/models-2026-12-05/session4/serve.sh offline:qwen2.5-coder-1.5b-instruct 8473 $S5/serve-q15.log &
t0=$(date +%s)
for i in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:8473/health && break; sleep 2; done
echo "$(date +%T) q15 server ready in $(( $(date +%s) - t0 )) s" >> $T
$S5/sel2.sh 8473 $S5/q15-en en given,given+abstain,ranked+abstain,top5+floor+abstain given,given+abstain,top5+floor+abstain
$S5/sel2.sh 8473 $S5/q15-zh zh given+abstain,top5+floor+abstain given+abstain,top5+floor+abstain
pkill -f "loopstack serve"
