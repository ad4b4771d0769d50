"""Engine requests per tool-call turn, and what a new tool set costs on its first turn.

For each mode (``auto``, ``required``, named) an agent-like turn (system prompt, user
question, the corpus tools) is sent and vLLM's own counter, ``vllm:request_success_total``
(relayed on the server's /metrics), is read before and after: engine requests per turn.
Then cold vs warm: a tool set no cache has seen (corpus tools renamed with a fresh suffix)
is sent twice in a row, each with its own vLLM ``cache_salt`` so that neither step reuses
the other's prefix cache (otherwise the warm step skips the prompt's prefill and the gap is
mostly prefill, not compile); the first step minus the second is what compiling the new
tools costs (our admission + the engine's grammar compile). Spread: min / median / max.

    loopstack bench serving turn-requests --base-url http://127.0.0.1:8000 --api-key KEY \\
        --turns 2 --cold 2 --tools 3
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import statistics
import time
from typing import Any

import httpx

from bench.common import CORPUS_PATH

CORPUS = CORPUS_PATH
_COUNTER = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.eE+]+)$", re.M)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
QUESTION = "What's the weather in Paris for the next {n} days?"


def engine_requests(client: httpx.Client) -> float:
    return sum(float(v) for v in _COUNTER.findall(client.get("/metrics").text))


def settled(client: httpx.Client) -> float:
    last = engine_requests(client)
    for _ in range(10):
        time.sleep(0.3)
        now = engine_requests(client)
        if now == last:
            return now
        last = now
    return last


def turn(
    client: httpx.Client, model: str, tools: list[Any], choice: Any, n: int, salt: str = ""
) -> tuple[float, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Use tools when useful."},
            {"role": "user", "content": QUESTION.format(n=n)},
        ],
        "tools": tools,
        "tool_choice": choice,
        "max_tokens": 96,
        "temperature": 0,
    }
    if salt:
        body["cache_salt"] = salt
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    return time.perf_counter() - started, r.json()


def _tokens(resp: dict[str, Any]) -> Any:
    """Completion tokens of a reply: equal on both steps, or the gap is not the compile."""
    return (resp.get("usage") or {}).get("completion_tokens", "?")


def corpus_tools(n: int, suffix: str) -> list[Any]:
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()][:n]
    tools = []
    for e in entries:
        fn = dict(e["tool"]["function"])
        fn["name"] = (fn["name"] + suffix)[:64]
        tools.append({"type": "function", "function": fn})
    return tools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="no /v1")
    ap.add_argument("--api-key", default="EMPTY")
    ap.add_argument("--turns", type=int, default=2, help="turns per mode")
    ap.add_argument("--cold", type=int, default=2, help="cold/warm pairs")
    ap.add_argument("--tools", type=int, default=3, help="corpus tools beside get_weather")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(base_url=args.base_url, headers=headers, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        tools = [WEATHER, *corpus_tools(args.tools, "")]
        named = {"type": "function", "function": {"name": "get_weather"}}
        turn(client, model, tools, "required", 3)  # compile these tools once
        for label, choice in (("auto", "auto"), ("required", "required"), ("named", named)):
            counts, calls = [], 0
            for i in range(args.turns):
                before = settled(client)
                _, resp = turn(client, model, tools, choice, 2 + i)
                counts.append(settled(client) - before)
                msg = (resp.get("choices") or [{}])[0].get("message") or {}
                calls += bool(msg.get("tool_calls"))
            print(f"{label:<9} engine requests per turn: {statistics.mean(counts):.2f} "
                  f"({counts}); turns with a call {calls}/{args.turns}")  # fmt: skip
        gaps = []
        for _ in range(args.cold):
            fresh = [WEATHER, *corpus_tools(args.tools, "_" + secrets.token_hex(3))]
            cold, c = turn(client, model, fresh, "required", 3, secrets.token_hex(8))
            warm, w = turn(client, model, fresh, "required", 3, secrets.token_hex(8))
            gaps.append(cold - warm)
            print(f"new tool set ({len(fresh)} tools): cold {cold:.2f} s, warm {warm:.2f} s "
                  f"(tokens out {_tokens(c)} / {_tokens(w)})")  # fmt: skip
        print(f"cold minus warm (no prefix cache on either): median "
              f"{statistics.median(gaps):.2f} s, min {min(gaps):.2f}, max {max(gaps):.2f} "
              f"over {len(gaps)} sets")  # fmt: skip
