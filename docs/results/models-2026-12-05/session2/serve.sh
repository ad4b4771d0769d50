#!/bin/bash
# serve.sh MODEL PORT LOG: the server with its shipped defaults
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOOPSTACK_MODEL=$1 LOOPSTACK_API_KEY=test-key-123 LOOPSTACK_PORT=$2 exec .venv/bin/loopstack serve > $3 2>&1
