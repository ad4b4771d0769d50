"""Prefix-cache hits of a tool-result turn (the results rule on) against the turn before it.

    python prefix_probe.py CLAUDE_FIRST.json   # loopstack on :8000 (key test-key-123), vLLM on :8001

CLAUDE_FIRST.json: Claude Code's first request, captured by
../agent-clients-2026-12-04/capture_claude.py (not committed: Claude Code's own prompt); its
first 8 tools are offered."""
import json, re, sys, httpx
BASE, ENGINE, KEY = "http://127.0.0.1:8000/v1", "http://127.0.0.1:8001", "test-key-123"
claude = json.load(open(sys.argv[1]))
tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
          "parameters": t.get("input_schema", {"type": "object"})}} for t in claude["tools"][:8]]
def hits():
    m = httpx.get(f"{ENGINE}/metrics").text
    g = lambda k: float(re.search(rf"^vllm:{k}{{[^}}]*}} (\S+)", m, re.M).group(1))
    return g("prefix_cache_queries_total"), g("prefix_cache_hits_total")
msgs = [{"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "Read note.txt and tell me the secret word in it."}]
c = httpx.Client(timeout=900, headers={"authorization": f"Bearer {KEY}"})
def turn(messages, label):
    q0, h0 = hits()
    r = c.post(f"{BASE}/chat/completions", json={"model": "qwen2.5-coder-1.5b-instruct", "messages": messages,
               "tools": tools, "max_tokens": 60, "temperature": 0})
    q1, h1 = hits()
    print(f"{label}: status {r.status_code}, prompt tokens {r.json()['usage']['prompt_tokens']}, "
          f"prefix-cache queries +{q1-q0:.0f}, hits +{h1-h0:.0f}; selection {r.headers.get('x-loopstack-selection')}")
    return r.json()
turn(msgs, "first turn")
turn(msgs, "first turn again")
answered = msgs + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "Read", "arguments": json.dumps({"file_path": "note.txt"})}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "The secret word is MARMOT-9598."}]
out = turn(answered, "tool-result turn")
print("answer:", out["choices"][0]["message"].get("content"))
