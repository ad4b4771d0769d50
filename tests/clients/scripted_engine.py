"""A scripted stand-in for vLLM's OpenAI server that answers with a tool call, for running the
real `loopstack serve` (``LOOPSTACK_ENGINE_URL``) under real clients without a model.

    python -m tests.clients.scripted_engine --port 8101 --served-model-name scripted

The script (``SCRIPTED_CALLS``: a JSON object, tool name -> arguments) decides each turn from
the prompt loopstack rendered, as a model would read it:

* the last user turn holds a tool result (``<tool_response>``): answer in text, quoting it
  (``Tool said: ...``), so a client's round trip is visible in its final answer;
* else, when a scripted tool is offered (``<tools>`` in the prompt; the constraint's text for
  a named choice): call it - the bare call object when the prompt ends with ``<tool_call>``
  (required / named: loopstack opened the call), else the call in its envelope (auto);
* else a greeting.

Answers /v1/completions (what loopstack's tool path sends), /v1/chat/completions (its
pass-through), streamed or whole with usage, plus /health, /v1/models and /metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

GREETING = "Hello from the scripted engine."
TOOL_CALL_OPEN = "<tool_call>\n"
CHUNK = 7  # characters per streamed piece


def scripted_calls() -> dict[str, Any]:
    raw = os.environ.get("SCRIPTED_CALLS", "{}")
    calls = json.loads(raw)
    assert isinstance(calls, dict)
    return calls


def offered_tools(prompt: str) -> list[str]:
    m = re.search(r"<tools>\n(.*?)\n</tools>", prompt, re.S)
    names = []
    for line in m.group(1).splitlines() if m else []:
        try:
            tool = json.loads(line)
        except ValueError:
            continue
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def last_tool_result(prompt: str) -> str | None:
    last_user = prompt.rfind("<|im_start|>user")
    turn = prompt[last_user:] if last_user >= 0 else ""
    found = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", turn, re.S)
    return found[-1].strip() if found else None


def turn_text(prompt: str, constraint: Any) -> str:
    result = last_tool_result(prompt)
    if result is not None:
        return "Tool said: " + " ".join(result.split())[:300]
    calls = scripted_calls()
    offered = offered_tools(prompt)
    choices = [n for n in calls if n in offered]
    if prompt.endswith(TOOL_CALL_OPEN) and constraint:  # a named choice: the one it names
        named = [n for n in choices if n in json.dumps(constraint)]
        choices = named or choices
    if not choices:
        return GREETING
    name = choices[0]
    obj = json.dumps({"name": name, "arguments": calls[name]})
    if prompt.endswith(TOOL_CALL_OPEN):
        return obj
    return TOOL_CALL_OPEN + obj + "\n</tool_call>"


def usage(prompt: str, text: str) -> dict[str, Any]:
    p, c = max(1, len(prompt) // 4), max(1, len(text) // 4)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def completions(request: Request) -> Response:
    body = await request.json()
    prompt = body["prompt"] if isinstance(body["prompt"], str) else str(body["prompt"])
    text = turn_text(prompt, body.get("structured_outputs"))
    if not body.get("stream"):
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        return JSONResponse({"id": "cmpl-s", "object": "text_completion", "model": body["model"],
                             "choices": [choice], "usage": usage(prompt, text)})  # fmt: skip

    async def events() -> AsyncIterator[bytes]:
        pieces = [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            choice = {"index": 0, "text": piece, "finish_reason": "stop" if last else None}
            yield sse({"id": "cmpl-s", "object": "text_completion", "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield sse({"id": "cmpl-s", "choices": [], "usage": usage(prompt, text)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def chat(request: Request) -> Response:
    body = await request.json()
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last.get("content"), str) else ""
    text = "Tool said: " + content[:300] if last.get("role") == "tool" else GREETING
    prompt = json.dumps(messages)
    if not body.get("stream"):
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "stop_reason": None}
        return JSONResponse({"id": "chatcmpl-s", "object": "chat.completion",
                             "model": body["model"], "choices": [choice],
                             "usage": usage(prompt, text)})  # fmt: skip

    async def events() -> AsyncIterator[bytes]:
        head = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        yield sse({"object": "chat.completion.chunk", "choices": [head]})
        for i in range(0, len(text), CHUNK):
            delta = {"index": 0, "delta": {"content": text[i : i + CHUNK]}, "finish_reason": None}
            yield sse({"object": "chat.completion.chunk", "choices": [delta]})
        end = {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None}
        yield sse({"object": "chat.completion.chunk", "choices": [end]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield sse({"object": "chat.completion.chunk", "choices": [],
                       "usage": usage(prompt, text)})  # fmt: skip
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def app(served: str) -> Starlette:
    async def health(_: Request) -> Response:
        return PlainTextResponse("")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse("")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default="scripted")
    ns = ap.parse_args()
    uvicorn.run(app(ns.served_model_name), host="127.0.0.1", port=ns.port, log_level="warning")


if __name__ == "__main__":
    main()
