#!/bin/bash
# after.sh: the 1.5B with its shipped selection through the README examples and the
# selection integration tests; then the multi-step set with --plan always and the plan
# pushes, the 1.5B and the 0.5B.
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t=$(date +%s)
LOOPSTACK_MODEL=offline:qwen2.5-coder-1.5b-instruct timeout 900 .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/integration/test_agent_answers.py tests/integration/test_tool_selection.py \
  > /work/scratch/m46/it-q15.log 2>&1
echo "$(date +%T) it-q15 rc=$? in $(( $(date +%s) - t )) s" >> /work/scratch/m46/after.timing
cd /work/scratch/m46
./run.sh offline:qwen2.5-coder-1.5b-instruct /work/scratch/m46/q15-push multiplan > q15-push.out 2>&1
./run.sh offline:qwen2.5-coder-0.5b-instruct /work/scratch/m46/q05-push multiplan > q05-push.out 2>&1
echo done > after.done
