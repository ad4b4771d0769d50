#!/bin/bash
# itest.sh MODEL OUT: the integration suite (what `make test` spends on the model) with MODEL
MODEL=$1; OUT=$2
cd /work/main
t=$(date +%s)
LOOPSTACK_MODEL=$MODEL HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout 3000 .venv/bin/pytest -ra --durations=25 \
  -p no:cacheprovider tests/integration > $OUT 2>&1
rc=$?
echo "$(date +%T) itest $MODEL rc=$rc in $(( $(date +%s) - t )) s" >> /work/scratch/m46b/timing.txt
