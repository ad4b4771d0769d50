"""A scripted OpenAI-compatible model, in process, for tests and the overhead bench.

`ScriptedModel` is an ``httpx.MockTransport`` handler: give it to
``AsyncOpenAI(http_client=httpx.AsyncClient(transport=httpx.MockTransport(model)))`` and the
real ``openai`` client code runs against it. Each chat request without
``response_format`` consumes the next scripted reply (a `Reply`, or a function of the
request body returning one); requests with ``response_format`` (the final-answer step)
get ``{"answer": ...}``, plan and re-plan requests (loopstack.agent.run.plan) the next of ``plans``
(``{"multi_step": ..., "steps": [{"goal": ...}]}``). Every request body and its headers
are kept for assertions.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

try:  # the openai client >= 3 is built on httpx2 (same API); older ones on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

__all__ = ["Reply", "ScriptedModel", "call", "calls", "text"]

_ids = itertools.count()


@dataclass(frozen=True)
class Reply:
    content: str | None = None
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    prompt_tokens: int = 100
    completion_tokens: int = 10
    status: int = 200
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens


def call(name: str, **arguments: Any) -> Reply:
    return Reply(tool_calls=((name, arguments),))


def calls(*pairs: tuple[str, dict[str, Any]]) -> Reply:
    return Reply(tool_calls=tuple(pairs))


def text(content: str) -> Reply:
    return Reply(content=content)


Script = Reply | Callable[[dict[str, Any]], Reply]


@dataclass
class ScriptedModel:
    script: Sequence[Script] = ()
    answer: str | Callable[[dict[str, Any]], str] = "scripted answer"
    model_ids: Sequence[str] = ("all-MiniLM-L6-v2", "scripted-model")
    summary: str = "scripted summary"  # reply to compaction requests
    repeat_last: bool = True  # after the script ends, keep replaying its last entry
    plans: Sequence[dict[str, Any]] = ()  # replies to plan / re-plan requests, in order
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens of replies
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _i: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            data = [{"id": m, "object": "model", "owned_by": "x"} for m in self.model_ids]
            return httpx.Response(200, json={"object": "list", "data": data})
        body = json.loads(request.content)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        fmt = (body.get("response_format") or {}).get("json_schema", {}).get("name")
        if fmt in ("plan", "replan"):
            n = sum(1 for r in self.requests if _format_name(r) in ("plan", "replan")) - 1
            plan = self.plans[min(n, len(self.plans) - 1)] if self.plans else {"steps": []}
            return self._response(body, Reply(content=json.dumps(plan)))
        if body.get("response_format"):
            ans = self.answer(body) if callable(self.answer) else self.answer
            return self._response(body, Reply(content=json.dumps({"answer": ans})))
        first = (body.get("messages") or [{}])[0].get("content") or ""
        if "tools" not in body and first.startswith("Summarize"):
            return self._response(body, Reply(content=self.summary))
        if not self.script:
            return self._response(body, Reply(content="no script"))
        idx = min(self._i, len(self.script) - 1) if self.repeat_last else self._i
        self._i += 1
        entry = self.script[idx]
        reply = entry(body) if callable(entry) else entry
        return self._response(body, reply)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The step requests (not final-answer or summary requests)."""
        return [
            r
            for r in self.requests
            if not r.get("response_format")
            and not r.get("messages", [{}])[0].get("content", "").startswith("You plan")
            and not str(r["messages"][0].get("content") or "").startswith("Summarize")
        ]

    def _response(self, body: dict[str, Any], reply: Reply) -> httpx.Response:
        if reply.status != 200:
            err = {"message": "scripted failure", "type": "server_error", "code": None}
            return httpx.Response(reply.status, json={"error": err})
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{next(_ids)}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a)},
                }
                for n, a in reply.tool_calls
            ]
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        cached = reply.cached_tokens if reply.cached_tokens is not None else self.cached_tokens
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if body.get("stream"):
            return self._stream(message, usage)
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{next(_ids)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "scripted-model"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(self, message: dict[str, Any], usage: dict[str, Any]) -> httpx.Response:
        content = message.get("content") or ""
        pieces = [content[i : i + 7] for i in range(0, len(content), 7)]
        chunks = []
        for p in pieces:
            chunks.append({"index": 0, "delta": {"content": p}, "finish_reason": None})
        chunks.append({"index": 0, "delta": {}, "finish_reason": "stop"})
        lines = []
        for ch in chunks:
            obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
            lines.append("data: " + json.dumps(obj | {"choices": [ch]}) + "\n\n")
        last = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        lines.append("data: " + json.dumps(last | {"choices": [], "usage": usage}) + "\n\n")
        lines.append("data: [DONE]\n\n")
        return httpx.Response(
            200, content="".join(lines).encode(), headers={"content-type": "text/event-stream"}
        )

    def client(self, **kw: Any) -> Any:
        """An ``AsyncOpenAI`` wired to this model."""
        from openai import AsyncOpenAI

        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return AsyncOpenAI(
            base_url="http://scripted/v1", api_key="k", http_client=http, max_retries=0, **kw
        )


def _format_name(body: dict[str, Any]) -> str | None:
    return (body.get("response_format") or {}).get("json_schema", {}).get("name")
