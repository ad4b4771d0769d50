"""Time to first token and prefix-cache hit of Claude Code's request, with and without the
attribution line stripped, against a running loopstack server and its real model.

    python measure_prefix.py BASE_URL KEY BODY.json   (BODY: capture_claude.py's output)

Three streamed requests of Claude Code's captured first request (its ~19k-token system
prompt, 24 tools; max_tokens 1), each with its own attribution line at the head of the system
prompt, as a new conversation has:

1. ``x-anthropic-billing-header: ...; cch=11111;`` - cold;
2. ``x-anthropic-billing-header: ...; cch=22222;`` - a second conversation: the server strips
   the line, so the prompt is the same as 1's and the prefix cache answers;
3. ``x-anthropic-billing-note: ...; cch=33333;`` - a line the server does not strip, standing
   for a server without stripping: the prompt differs from its first tokens.

Prints one JSON line per request: time to the first content event, usage (input_tokens,
cache_read_input_tokens) from ``message_delta``, the clamped max_tokens header.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx

LINE = "x-anthropic-billing-{kind}: cc_version=2.1.197.{v}; cc_entrypoint=sdk-cli; cch={c};"
RUNS = [("stripped, first", "header", "11111"), ("stripped, second conversation", "header",
        "22222"), ("not stripped, second conversation", "note", "33333")]  # fmt: skip


def one(client: httpx.Client, body: dict[str, Any], label: str) -> dict[str, Any]:
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    pings = 0
    with client.stream("POST", "/v1/messages?beta=true", json=body) as resp:
        if resp.status_code != 200:
            return {"label": label, "status": resp.status_code, "body": resp.read().decode()[:500]}
        name = ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
                if name == "ping":
                    pings += 1
                elif name != "message_start" and first is None:
                    first = time.perf_counter() - started
            elif line.startswith("data: ") and name == "message_delta":
                usage = json.loads(line[6:])["usage"]
    return {"label": label, "ttft_s": round(first or -1, 2),
            "total_s": round(time.perf_counter() - started, 2), "pings": pings, "usage": usage,
            "clamped": resp.headers.get("x-loopstack-max-tokens-clamped")}  # fmt: skip


def main() -> None:
    base, key, path = sys.argv[1:4]
    captured = json.loads(open(path).read())
    headers = {"x-api-key": key, "anthropic-beta": "claude-code-20250219"}
    with httpx.Client(base_url=base, headers=headers, timeout=900) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for label, kind, cch in RUNS:
            body = json.loads(json.dumps(captured))
            body.update(model=model, max_tokens=1, stream=True)
            body["system"][0]["text"] = LINE.format(kind=kind, v=cch[:3], c=cch)
            print(json.dumps(one(client, body, label)), flush=True)


if __name__ == "__main__":
    main()
