#!/bin/bash
# zh.sh DIR TAG: the travel team task asked in Chinese, through the CLI (DIR: code to run)
cd $1
Q="我带着500欧元飞往东京。这些钱能换多少日元？东京今天天气怎么样？"
t=$(date +%s)
GOLDEN_WORKDIR=/work/scratch/m46c/zh-work HF_HUB_OFFLINE=1 LOOPSTACK_API_KEY=test-key-123 LOOPSTACK_HOME=/work/scratch/m46c/zh-home /work/main/.venv/bin/python -m loopstack agent run "$Q" --team /work/main/bench/golden/teams/travel.yaml \
  --base-url http://127.0.0.1:8460/v1 --max-steps 6 --no-memory --json > /work/scratch/m46c/zh-$2.json 2>/work/scratch/m46c/zh-$2.err
echo "$(date +%T) zh-$2 rc=$? in $(( $(date +%s) - t )) s $1" >> /work/scratch/m46b/timing.txt
