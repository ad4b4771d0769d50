"""The GPU path, checked without a GPU.

No machine that builds or tests loopstack has an NVIDIA GPU, so what differs on one is checked
against the GPU build's own files instead:

* `wheel` fetches the `vllm` wheel that ``requirements/engine-gpu.txt`` pins (by version, from
  the registry, without its dependencies) and keeps its Python sources and metadata in a cache;
* `probe` runs inside those sources (under a stub of the compiled CUDA extension) and answers
  with vLLM's own argument parser, request models and dependency pins;
* `lock` writes ``requirements/constraints-gpu.txt`` from a resolver dry run and checks it.

tests/unit/serving/test_gpu_engine.py and tests/unit/deploy/test_gpu_constraints.py use them.
"""
