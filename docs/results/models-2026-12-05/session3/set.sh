#!/bin/bash
# set.sh CODE PORT OUT SET TASKS [ENV=value ...]: a golden task set (golden, multi, service)
# against a running server, with the bench and the agent of CODE (/work/main, or a git worktree
# holding a change being tried); TASKS: comma-separated ids, or - for the whole set.
#   the service set:        set.sh /work/main 8460 OUT service -
#   the multi set, a change: set.sh WORKTREE 8460 OUT multi -
#   its three team tasks:   set.sh WORKTREE 8460 OUT multi team_sales_share,team_research_summary,team_travel
CODE=$1 PORT=$2 OUT=$3 SET=$4 TASKS=$5
shift 5
cd "$CODE" || exit 2
only=()
[ "$TASKS" != - ] && only=(--tasks "$TASKS")
t=$(date +%s)
env "$@" LOOPSTACK_AGENT_WALL_CLOCK_S=900 HF_HUB_OFFLINE=1 timeout 1800 \
  /work/main/.venv/bin/python -m loopstack bench golden run --base-url "http://127.0.0.1:$PORT/v1" \
  --api-key test-key-123 --set "$SET" "${only[@]}" --concurrency 3 --out "$OUT" > "$OUT.log" 2>&1
rc=$?
echo "$(date +%T) $OUT rc=$rc in $(( $(date +%s) - t )) s $CODE $*" >> "${TIMING:-/work/scratch/m46b/timing.txt}"
