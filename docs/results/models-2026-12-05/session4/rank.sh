#!/bin/bash
# rank.sh MODEL OUT: the full ranked list (no top_k, no floor) + the abstention rule as the
# server's default: selection at 10 tools, the abstention set, golden, the README examples.
MODEL=$1 OUT=$2
set -u; mkdir -p $OUT; cd /work/main
PORT=8460; URL=http://127.0.0.1:$PORT/v1; KEY=test-key-123
T=$OUT/timing.txt
/work/scratch/m47/serve.sh $MODEL $PORT $OUT/serve.log LOOPSTACK_TOOL_RANK=1 &
S=$!
t0=$(date +%s)
for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break; sleep 2; done
echo "$(date +%T) ready after $(( $(date +%s) - t0 )) s" >> $T
t=$(date +%s)
HF_HUB_OFFLINE=1 timeout 2700 .venv/bin/loopstack bench agent selection --base-url $URL --api-key $KEY \
  --sizes 10 --items 6 --arms given,given+abstain,ranked+abstain,defaults \
  --abstention-arms given,given+abstain,ranked+abstain,defaults --concurrency 3 --out $OUT/sel \
  > $OUT/sel.jsonl 2> $OUT/sel.err
echo "$(date +%T) selection rc=$? in $(( $(date +%s) - t )) s" >> $T
t=$(date +%s)
LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 .venv/bin/loopstack bench golden run \
  --base-url $URL --api-key $KEY --concurrency 3 --out $OUT/golden > $OUT/golden.log 2>&1
echo "$(date +%T) golden rc=$? in $(( $(date +%s) - t )) s" >> $T
kill $S; wait $S 2>/dev/null; sleep 5
t=$(date +%s)
LOOPSTACK_TOOL_RANK=1 LOOPSTACK_MODEL=$MODEL HF_HUB_OFFLINE=1 timeout 1200 .venv/bin/python -m pytest -q -ra \
  tests/integration/test_agent_answers.py tests/integration/test_tool_selection.py > $OUT/readme.log 2>&1
echo "$(date +%T) readme rc=$? in $(( $(date +%s) - t )) s" >> $T
