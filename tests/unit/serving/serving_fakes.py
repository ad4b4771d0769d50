"""Fakes for the serving router tests: an Engine that answers like vLLM's OpenAI server from a
script, and a tokenizer with a chat template, so the real ChatService/router run model-free."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from loopstack.serving.config import DEFAULT_BACKEND, BackendName
from loopstack.serving.constraint.backend import ConstraintBackend
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.embeddings import EmbeddingService
from loopstack.serving.exceptions import UpstreamError
from loopstack.serving.http.admission import Admission
from loopstack.serving.http.app import AppState, build_app
from loopstack.serving.http.limits import Limits
from loopstack.serving.http.service import ChatService
from loopstack.serving.metrics import Metrics
from loopstack.serving.prompt import PromptBuilder

MODEL = "test-model"
ENGINE_METRICS = "# HELP vllm:num_requests_running Running.\nvllm:num_requests_running 0.0\n"


class FakeTokenizer:
    """Renders a Qwen-like prompt; one token per whitespace-separated word."""

    chat_template = "{% if tools %}<tools>{{ tools }}</tools>{% endif %}{{ messages }}"

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        assert tokenize is False
        out = []
        if tools:
            listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            out.append(f"<|im_start|>system\n<tools>\n{listing}\n</tools><|im_end|>\n")
        for m in conversation:
            if not isinstance(m.get("content"), str):
                raise TypeError("content must be a string")
            text = m["content"]
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                payload = {"name": fn["name"], "arguments": fn["arguments"]}
                text += f"\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"
            out.append(f"<|im_start|>{m['role']}\n{text}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}


NAME_STAGE = r'\{"name": "('
ARGS_KEY = '"arguments": '


class FakeEngine:
    """vLLM-shaped answers from scripts: an engine whose transport is itself (`send`).

    `free` / `constrained`: texts for /v1/completions without / with ``structured_outputs``;
    each request takes the next one (the last one repeats). Under a grammar backend's
    constraint (guidance, the default; xgrammar) a constrained text is the whole turn; under a
    regex (the outlines path) it is a whole call, given out in its two stages. Streams send
    `chunk` characters per SSE event. `gate`, when set, holds every request until it is set.
    """

    model_name = "engine-internal-name"

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.free: list[str] = ["Hello! How can I help?"]
        self.constrained: list[str] = []
        self.finish_reason = "stop"
        self.chunk = 3
        self.is_healthy = True
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.streams_closed_early = 0
        self.pieces_sent = 0  # completion chunks streamed so far, over all requests
        self._pending: str | None = None
        self.chat_content = '{"answer": 42}'
        self.chat_script: list[str] = []  # chat replies in turn (the last repeats), else above
        self.fail: tuple[int, dict[str, Any]] | None = None  # /v1/completions streams fail so
        self.cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens

    # -- Engine protocol ------------------------------------------------------------------
    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def healthy(self) -> bool:
        return self.is_healthy

    async def metrics_text(self) -> str:
        return ENGINE_METRICS

    @property
    def transport(self) -> FakeEngine:
        return self

    async def send(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """The one transport method: a stream when the body asks for one, else the answer."""
        if body.get("stream"):
            async for line in self._stream(path, body):
                yield line
            return
        yield json.dumps(await self._post(path, body)).encode()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._enter(path, body)
        if path == "/v1/chat/completions":
            return self._chat_response(body)
        assert path == "/v1/completions", path
        text = self._next(body)
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": self.model_name,
            "choices": [
                {"index": 0, "text": text, "finish_reason": self.finish_reason, "logprobs": None}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(self._pieces(text))},
        }

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        await self._enter(path, body)
        finished = False
        try:
            if path == "/v1/chat/completions":
                for piece in self._pieces(self.chat_content):
                    delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                    yield _sse({"object": "chat.completion.chunk", "choices": [delta]})
                yield _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            else:
                assert path == "/v1/completions", path
                if self.fail is not None:
                    raise UpstreamError(*self.fail)
                pieces = self._pieces(self._next(body))
                for i, piece in enumerate(pieces):
                    self.pieces_sent += 1
                    last = i == len(pieces) - 1
                    choice = {
                        "index": 0,
                        "text": piece,
                        "finish_reason": self.finish_reason if last else None,
                    }
                    yield _sse({"object": "text_completion", "choices": [choice]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": len(pieces)}
                    if self.cached_tokens is not None:
                        usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
                    yield _sse({"choices": [], "usage": usage})
            finished = True  # the consumer may stop reading at [DONE]
            yield b"data: [DONE]"
        finally:
            if not finished:
                self.streams_closed_early += 1

    # -- helpers --------------------------------------------------------------------------
    async def _enter(self, path: str, body: dict[str, Any]) -> None:
        self.requests.append((path, json.loads(json.dumps(body))))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()

    def _next(self, body: dict[str, Any]) -> str:
        if "structured_outputs" not in body:
            assert self.free, "no scripted free output"
            return self.free.pop(0) if len(self.free) > 1 else self.free[0]
        # A scripted constrained output is a whole call; the service asks for it in two
        # stages: the head (name regex), then the arguments (whose prompt ends with the head).
        if "regex" not in body["structured_outputs"]:  # a grammar backend: the whole turn
            assert self.constrained, "no scripted turn"
            return self.constrained.pop(0) if len(self.constrained) > 1 else self.constrained[0]
        regex = body["structured_outputs"]["regex"]
        if self._pending is not None and not regex.startswith(NAME_STAGE):
            rest, self._pending = self._pending, None
            return rest
        script = self.constrained
        assert script, f"no scripted output for {regex}"
        text = script.pop(0) if len(script) > 1 else script[0]
        cut = text.find(ARGS_KEY)
        if cut < 0:
            return text
        head, rest = text[: cut + len(ARGS_KEY)], text[cut + len(ARGS_KEY) :]
        if regex.startswith(NAME_STAGE):
            self._pending = rest
            return head
        return rest

    def _pieces(self, text: str) -> list[str]:
        return [text[i : i + self.chunk] for i in range(0, len(text), self.chunk)] or [""]

    def _chat_response(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.chat_script:
            script = self.chat_script
            self.chat_content = script.pop(0) if len(script) > 1 else script[0]
        message = {"role": "assistant", "content": self.chat_content}
        return {
            "id": "chatcmpl-engine",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }

    # -- what the service asked for -------------------------------------------------------
    def completions(self, *, constrained: bool | None = None) -> list[dict[str, Any]]:
        return [
            b
            for p, b in self.requests
            if p == "/v1/completions"
            and (constrained is None or ("structured_outputs" in b) == constrained)
        ]


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode()


class Harness:
    def __init__(
        self,
        *,
        api_key: str | None = None,
        max_model_len: int | None = None,
        max_running: int = 8,
        max_waiting: int = 8,
        limits: Limits | None = None,
        backend: ConstraintBackend | BackendName = DEFAULT_BACKEND,
        ranker: Any = None,
    ) -> None:
        """`backend`: a backend, or the name of one built by the factory as the server
        builds it (sandbox in threads, a byte-level vocabulary); the default's by default."""
        self.engine = FakeEngine()
        self.metrics = Metrics()
        self.prompts = PromptBuilder(FakeTokenizer(), max_model_len=max_model_len)
        if isinstance(backend, str):
            backend = make_backend(backend, None, mode="thread", metrics=self.metrics)
        self.backend = backend
        self.chat = ChatService(
            self.engine,  # type: ignore[arg-type]
            self.prompts,
            metrics=self.metrics,
            max_tool_tokens=256,
            backend=backend,
            ranker=ranker,
        )
        self.state = AppState(
            engine=self.engine,  # type: ignore[arg-type]
            chat=self.chat,
            embeddings=EmbeddingService("all-MiniLM-L6-v2"),
            metrics=self.metrics,
            admission=Admission(
                self.metrics, max_running=max_running, max_waiting=max_waiting, retry_after_s=7
            ),
            model_name=MODEL,
            api_key=api_key,
            max_model_len=max_model_len,
            limits=limits or Limits(),
        )
        self.app = build_app(self.state)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://loopstack.test"
        )

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value
