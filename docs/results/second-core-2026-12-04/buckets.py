"""Group py-spy raw (collapsed) stacks into stages: python buckets.py ours|core|api FILE."""
import collections, sys
RULES = {
    "core": [
        ("structured output (grammar masks)", ("structured_output", "llguidance", "xgrammar", "guidance")),
        ("sampling", ("v1/sample", "sampler")),
        ("scheduler", ("v1/core/sched", "kv_cache_manager", "block_pool")),
        ("model forward (torch ops)", ("model_executor", "execute_model", "_model_forward", "torch/nn", "at::", "dnnl", "libgomp", "mkl")),
        ("I/O with the API server (zmq, msgpack)", ("zmq", "serial_utils", "msgspec", "process_input_sockets", "process_output_sockets")),
    ],
    "ours": [
        ("constraint (our grammar/regex build)", ("loopstack/serving/constraint",)),
        ("tool ranking (embedder)", ("loopstack/serving/selection", "sentence_transformers")),
        ("prompt render + tokenize", ("serving/prompt", "jinja2", "tokenizers", "transformers/tokenization", "apply_chat_template")),
        ("JSON / pydantic", ("pydantic", "json/", "orjson", "jsonschema")),
        ("HTTP (uvicorn, starlette, httpx)", ("uvicorn", "starlette", "httpx", "h11", "httpcore", "anyio")),
        ("metrics / logging", ("prometheus", "logging/")),
    ],
    "api": [
        ("tokenize / detokenize", ("tokeniz", "detokeniz")),
        ("chat template / tool parser", ("chat_utils", "tool_parsers", "jinja2")),
        ("HTTP + serialisation", ("uvicorn", "starlette", "fastapi", "pydantic", "json")),
        ("engine client I/O (zmq)", ("zmq", "msgspec", "serial_utils", "core_client")),
        ("output processing", ("output_processor", "logprobs")),
    ],
}
kind, path = sys.argv[1], sys.argv[2]
counts = collections.Counter(); total = 0
for line in open(path):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); total += n
    for name, keys in RULES[kind]:
        if any(k in stack for k in keys):
            counts[name] += n; break
    else:
        counts["other (event loop, threads, python)"] += n
for name, n in counts.most_common():
    print(f"{n/total*100:5.1f} %  {n:6d}  {name}")
print(f"{total} samples at 50 Hz = {total/50:.1f} s on CPU")
