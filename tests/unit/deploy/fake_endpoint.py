"""A scripted stand-in for `loopstack serve`, for deploy/gpu-smoke.sh's tests (no model here).

    python fake_endpoint.py serve          # on $LOOPSTACK_PORT, key $LOOPSTACK_API_KEY

It answers the OpenAI API as our server does, from the request alone: a request with tools
gets one call (the named tool, else the first), its arguments built from the tool's schema; once
a tool result is in the conversation (``auto``), or without tools, a short text; a
``response_format`` JSON schema gets a JSON value of that schema. ``stream`` sends SSE chunks
(usage last when asked). ``FAKE_REFUSE=1``: healthy, but every generation is refused (400),
as a server whose engine rejects everything.

Any other command (``loopstack bench ...``) runs the real CLI, so the benchmarks the smoke
script runs are the real ones, against this endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def value(schema: Any) -> Any:
    """A small JSON value valid for the common JSON Schema keywords."""
    if not isinstance(schema, dict):
        return "x"
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: value(props.get(k, {})) for k in schema.get("required", list(props)[:1])}
    if kind == "array":
        return [value(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    formats = {"date": "2026-01-02", "date-time": "2026-01-02T03:04:05Z",
               "email": "a@example.com", "uri": "https://example.com"}  # fmt: skip
    return formats.get(schema.get("format"), "x" * max(1, schema.get("minLength", 1)))


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for a chat request."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    answered = any(m.get("role") == "tool" for m in body.get("messages", []))
    if tools and choice != "none" and not (choice == "auto" and answered):
        fn = tools[0]["function"]
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            fn = next(t["function"] for t in tools if t["function"]["name"] == name)
        args = json.dumps(value(fn.get("parameters", {})))
        call = {"id": "call_1", "type": "function",
                "function": {"name": fn["name"], "arguments": args}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        return {"role": "assistant", "content": json.dumps(value(rf["json_schema"]["schema"]))}
    return {"role": "assistant", "content": "Done: the tools answered."}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self) -> bool:
        if self.headers.get("authorization") == "Bearer " + os.environ["LOOPSTACK_API_KEY"]:
            return True
        self.reply(401, json.dumps({"error": {"message": "bad key", "type": "auth"}}))
        return False

    def do_GET(self) -> None:
        if self.path == "/health":
            return self.reply(200, '{"status": "ok"}')
        if self.path == "/metrics":
            return self.reply(200, "vllm:prefix_cache_queries_total 10\n"
                              "vllm:prefix_cache_hits_total 4\n", "text/plain")  # fmt: skip
        if not self.authorized():
            return None
        if self.path == "/v1/models":
            models = {"object": "list", "data": [{"id": "fake", "object": "model"}]}
            return self.reply(200, json.dumps(models))
        return self.reply(404, '{"error": {"message": "no route"}}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if not self.authorized():
            return None
        if os.environ.get("FAKE_REFUSE") == "1" or self.path != "/v1/chat/completions":
            error = {"message": "refused", "type": "invalid_request_error"}
            return self.reply(400, json.dumps({"error": error}))
        message = answer(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            completion = {"id": "chatcmpl-1", "object": "chat.completion", "usage": usage,
                          "created": int(time.time()), "model": body.get("model", "fake"),
                          "choices": [choice]}  # fmt: skip
            return self.reply(200, json.dumps(completion))
        return self.stream(body, message, finish, usage)

    def stream(self, body: dict[str, Any], message: dict[str, Any], finish: str,
               usage: dict[str, Any]) -> None:  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        for call in message.get("tool_calls") or []:
            args = call["function"]["arguments"]
            head = {**call, "index": 0, "function": {"name": call["function"]["name"],
                                                     "arguments": ""}}  # fmt: skip
            deltas.append({"tool_calls": [head]})
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 4]}}]}
                       for i in range(0, len(args), 4)]  # fmt: skip
        text = message.get("content") or ""
        deltas += [{"content": text[i : i + 4]} for i in range(0, len(text), 4)]
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake",
                "created": int(time.time())}  # fmt: skip
        for i, delta in enumerate(deltas):
            done = finish if i == len(deltas) - 1 else None
            self.event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": done}]})
            time.sleep(0.002)
        if (body.get("stream_options") or {}).get("include_usage"):
            self.event({**base, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def event(self, obj: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> int:
    if sys.argv[1:2] != ["serve"]:  # `loopstack bench ...`: the real CLI
        return subprocess.call([sys.executable, "-m", "loopstack", *sys.argv[1:]])
    port = int(os.environ["LOOPSTACK_PORT"])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
