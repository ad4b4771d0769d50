#!/bin/bash
# ab.sh MODEL OUT "CODE:SET[:TASKS] ..." : serve MODEL once (shipped defaults), run each golden set
# with the bench + agent of CODE (/work/main or a worktree), one after another.
MODEL=$1 OUT=$2 RUNS=$3
set -u; mkdir -p $OUT
PORT=8460; T=$OUT/timing.txt
/work/scratch/m47/serve.sh $MODEL $PORT $OUT/serve.log &
S=$!; t0=$(date +%s)
for i in $(seq 900); do curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break; sleep 2; done
echo "$(date +%T) ready after $(( $(date +%s) - t0 )) s" >> $T
for r in $RUNS; do
  IFS=: read code set tasks <<< "$r"
  name=$(basename $code)-$set
  TIMING=$T bash /work/main/docs/results/models-2026-12-05/session3/set.sh $code $PORT $OUT/$name $set ${tasks:--}
done
kill $S; wait $S 2>/dev/null
