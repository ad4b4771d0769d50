#!/bin/bash
# serve.sh MODEL PORT LOG [ENV=value ...]: serve a model with env overrides (foreground)
MODEL=$1 PORT=$2 LOG=$3; shift 3
cd /work/main
exec env "$@" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LOOPSTACK_MODEL=$MODEL LOOPSTACK_API_KEY=test-key-123 LOOPSTACK_PORT=$PORT .venv/bin/loopstack serve > $LOG 2>&1
