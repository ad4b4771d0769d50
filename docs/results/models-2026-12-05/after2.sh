#!/bin/bash
# the 0.5B's README agent examples with the abstention rule as the server default, twice
while [ ! -f /work/scratch/m46/after.done ]; do sleep 10; done
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
for i in 1 2; do
  t=$(date +%s)
  LOOPSTACK_TOOL_ABSTAIN=1 timeout 600 .venv/bin/python -m pytest -q -p no:cacheprovider -rA \
    tests/integration/test_agent_answers.py > /work/scratch/m46/it-q05-abstain-$i.log 2>&1
  echo "$(date +%T) it-q05-abstain-$i rc=$? in $(( $(date +%s) - t )) s" >> /work/scratch/m46/after.timing
done
echo done > /work/scratch/m46/after2.done
