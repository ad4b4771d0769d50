#!/bin/bash
# the multi-step set, --plan always, with the push asking for a call (38c8a07)
while [ ! -f /work/scratch/m46/after3.done ]; do sleep 10; done
cd /work/scratch/m46
./run.sh offline:qwen2.5-coder-1.5b-instruct /work/scratch/m46/q15-push2 multiplan > q15-push2.out 2>&1
./run.sh offline:qwen2.5-coder-0.5b-instruct /work/scratch/m46/q05-push2 multiplan > q05-push2.out 2>&1
echo done > after4.done
