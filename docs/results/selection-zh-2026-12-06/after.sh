#!/bin/bash
# after base-en: golden (shipped) on the base server; then a server of the new code with top5+floor+rule
# as defaults: after-zh, after-en (ranked arms only), golden with those defaults; then the README tests.
set -u; cd /work/main
S5=/work/scratch/s5; T=$S5/timing.txt; KEY=test-key-123
while pgrep -f "out $S5/base-" >/dev/null || [ ! -s $S5/base-en.timing ]; do sleep 5; done
t=$(date +%s)
LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench golden run \
  --base-url http://127.0.0.1:8470/v1 --api-key $KEY --concurrency 3 --out $S5/golden-shipped > $S5/golden-shipped.log 2>&1
echo "$(date +%T) golden shipped rc=$? in $(( $(date +%s) - t )) s" >> $T
pkill -f "LOOPSTACK_PORT=8470" ; pkill -f "loopstack serve"; sleep 15
bash docs/results/models-2026-12-05/session4/serve.sh offline:qwen2.5-coder-0.5b-instruct 8471 $S5/serve-after.log \
  LOOPSTACK_TOOL_RANK=1 LOOPSTACK_TOOL_TOP_K=5 LOOPSTACK_TOOL_MIN_SCORE=0.3 &
t0=$(date +%s)
for i in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:8471/health && break; sleep 2; done
echo "$(date +%T) after server ready in $(( $(date +%s) - t0 )) s" >> $T
$S5/sel2.sh 8471 $S5/after-zh zh ranked+abstain,top5+floor+abstain,defaults top5+floor+abstain,defaults
$S5/sel2.sh 8471 $S5/after-en en ranked+abstain,top5+floor+abstain,defaults top5+floor+abstain,defaults
t=$(date +%s)
LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench golden run \
  --base-url http://127.0.0.1:8471/v1 --api-key $KEY --concurrency 3 --out $S5/golden-top5 > $S5/golden-top5.log 2>&1
echo "$(date +%T) golden top5+floor+rule rc=$? in $(( $(date +%s) - t )) s" >> $T
pkill -f "loopstack serve"; sleep 15
t=$(date +%s)
LOOPSTACK_TOOL_RANK=1 LOOPSTACK_TOOL_TOP_K=5 LOOPSTACK_TOOL_MIN_SCORE=0.3 HF_HUB_OFFLINE=1 timeout 1500 \
  .venv/bin/python -m pytest -q -ra tests/integration/test_agent_answers.py tests/integration/test_tool_selection.py > $S5/readme-top5.log 2>&1
echo "$(date +%T) readme top5 rc=$? in $(( $(date +%s) - t )) s" >> $T
