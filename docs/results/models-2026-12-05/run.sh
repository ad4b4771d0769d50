#!/bin/bash
# m46: the #46 figures not measured on 2026-12-04, one model at a time, idle box.
# run.sh MODEL OUT PARTS  (PARTS: sel,agents,multiplan)
set -u
MODEL=$1; OUT=$2; PARTS=$3
mkdir -p $OUT; cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
KEY=test-key-123; PORT=8460; URL=http://127.0.0.1:$PORT/v1
procs() { echo "$1"; for c in $(ps -o pid= --ppid "$1"); do procs "$c"; done; }
tree_rss_kb() { local t=0 r; for p in $(procs "$1"); do r=$(ps -o rss= -p "$p"); t=$((t + ${r:-0})); done; echo $t; }
t0=$(date +%s)
LOOPSTACK_MODEL=$MODEL LOOPSTACK_API_KEY=$KEY LOOPSTACK_PORT=$PORT .venv/bin/loopstack serve > $OUT/serve.log 2>&1 &
S=$!
trap 'kill $S 2>/dev/null; wait $S 2>/dev/null' EXIT TERM INT
for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break; sleep 2; done
echo "$(date +%T) ready after $(( $(date +%s) - t0 )) s" | tee $OUT/timing.txt
( while kill -0 $S 2>/dev/null; do echo "$(date +%T) rss_kb=$(tree_rss_kb $S)" >> $OUT/rss.txt; sleep 30; done ) &
lscpu > $OUT/lscpu.txt
step() { local name=$1; shift; local t=$(date +%s); "$@"; echo "$(date +%T) $name rc=$? in $(( $(date +%s) - t )) s" | tee -a $OUT/timing.txt; }
case ,$PARTS, in *,sel,*)
step selection timeout 2700 .venv/bin/loopstack bench agent selection --base-url $URL --api-key $KEY \
  --sizes 10 --items 6 --arms given,reversed,shuffled,ranked,given+abstain,top5+abstain \
  --abstention-arms given,given+abstain,top5+abstain --concurrency 3 --out $OUT/sel \
  > $OUT/sel.jsonl 2> $OUT/sel.err ;; esac
case ,$PARTS, in *,agents,*)
step agents timeout 1200 .venv/bin/loopstack bench agents --base-url $URL --api-key $KEY --agents 1,4,8 \
  --tasks-per-agent 2 --prewarm --out $OUT/agents > $OUT/agents.log 2>&1 ;; esac
case ,$PARTS, in *,multiplan,*)
step multiplan env LOOPSTACK_AGENT_WALL_CLOCK_S=900 timeout 1500 .venv/bin/loopstack bench golden run \
  --base-url $URL --api-key $KEY --set multi --plan always --concurrency 3 --out $OUT/multi-plan \
  > $OUT/multi-plan.log 2>&1 ;; esac
