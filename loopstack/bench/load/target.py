"""The endpoint under test: a ``Target`` protocol and its OpenAI-compatible implementation.

A target is a base URL + API key + model + ``extra_body``.  ``chat_step`` streams one chat
completion (``stream=True`` with ``stream_options.include_usage``) and returns its timings,
usage and the assembled tool calls; ``scrape_metrics`` reads the server's Prometheus
``/metrics`` (same host, without ``/v1``).  HTTP errors are answers, not exceptions.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from loopstack.bench.common import calls_from_text
from loopstack.bench.load import TargetError

logger = logging.getLogger(__name__)
JSON = dict[str, Any]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class StepResponse:
    """One model call: perf_counter timings (s), usage, the reply, or the error."""

    ok: bool
    start: float
    end: float
    first_token: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    text_calls: bool = False  # calls read leniently from the text (lenient targets only)

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


class Target(Protocol):
    """What the scheduler needs from an endpoint."""

    name: str
    model: str

    async def chat_step(
        self, messages: list[JSON], tools: list[JSON], tool_choice: Any, params: JSON
    ) -> StepResponse: ...

    async def scrape_metrics(self) -> str | None: ...

    async def close(self) -> None: ...


@dataclass
class TargetConfig:
    name: str
    base_url: str
    api_key: str = "EMPTY"
    model: str | None = None
    extra_body: JSON = field(default_factory=dict)
    lenient_text_calls: bool = False  # read ```json / <tool_call> text as calls (raw vLLM)
    tool_choice: str | None = None  # overrides the scenario's mode for this target
    timeout_s: float = 600.0

    def public(self) -> JSON:
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "extra_body": self.extra_body,
            "lenient_text_calls": self.lenient_text_calls,
            "tool_choice": self.tool_choice,
        }


def metrics_url(base_url: str) -> str:
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


class OpenAITarget:
    """An OpenAI-compatible chat endpoint driven with the official ``openai`` client."""

    def __init__(self, cfg: TargetConfig, http_client: Any = None) -> None:
        """``http_client``: an async httpx client to use (tests pass a mock transport)."""
        from openai import AsyncOpenAI

        self.cfg = cfg
        self.name = cfg.name
        self.model = cfg.model or ""
        self._http = http_client
        self.client = AsyncOpenAI(
            base_url=cfg.base_url,
            api_key=cfg.api_key,
            timeout=cfg.timeout_s,
            max_retries=0,
            http_client=http_client,
        )

    async def open(self) -> OpenAITarget:
        if not self.model:
            try:
                models = await self.client.models.list()
            except Exception as exc:
                raise TargetError(
                    f"{self.name}: cannot list models at {self.cfg.base_url}: {exc}"
                ) from exc
            if not models.data:
                raise TargetError(f"{self.name}: {self.cfg.base_url} lists no models")
            self.model = str(models.data[0].id)
            self.cfg.model = self.model
        return self

    async def chat_step(
        self, messages: list[JSON], tools: list[JSON], tool_choice: Any, params: JSON
    ) -> StepResponse:
        import openai

        kwargs: JSON = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = tool_choice
        extra = {**self.cfg.extra_body, **kwargs.pop("extra_body", {})}
        if extra:
            kwargs["extra_body"] = extra
        res = StepResponse(ok=False, start=time.perf_counter(), end=0.0)
        calls: dict[int, JSON] = {}
        try:
            stream: Any = await self.client.chat.completions.create(**kwargs)
            async for chunk in stream:
                self._absorb(res, calls, chunk)
            res.ok = True
        except openai.APIStatusError as exc:
            res.status = exc.status_code
            res.error = f"HTTP {exc.status_code}: {str(exc.message)[:200]}"
        except Exception as exc:  # transport errors are counted, not fatal
            res.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        res.end = time.perf_counter()
        res.tool_calls = [
            ToolCall(c["id"] or f"call_{uuid.uuid4().hex[:12]}", c["name"], c["arguments"])
            for _, c in sorted(calls.items())
            if c["name"]
        ]
        if res.ok and not res.tool_calls and self.cfg.lenient_text_calls and tools:
            res.tool_calls = [
                ToolCall(f"call_{uuid.uuid4().hex[:12]}", str(name), _as_text(args))
                for name, args in calls_from_text(res.content)
                if name
            ]
            res.text_calls = bool(res.tool_calls)
        if res.error:
            logger.debug("%s step failed: %s", self.name, res.error)
        return res

    @staticmethod
    def _absorb(res: StepResponse, calls: dict[int, JSON], chunk: Any) -> None:
        usage = getattr(chunk, "usage", None)
        if usage:
            res.prompt_tokens = int(usage.prompt_tokens or 0)
            res.completion_tokens = int(usage.completion_tokens or 0)
            details = getattr(usage, "prompt_tokens_details", None)
            if details is not None and getattr(details, "cached_tokens", None) is not None:
                res.cached_tokens = int(details.cached_tokens)
        for choice in chunk.choices or []:
            delta = choice.delta
            got = False
            if delta.content:
                res.content += delta.content
                got = True
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                fn = tc.function
                if fn is not None:
                    if fn.name:
                        slot["name"] += fn.name
                        got = True
                    if fn.arguments:
                        slot["arguments"] += fn.arguments
                        got = True
            if got and res.first_token is None:
                res.first_token = time.perf_counter()
            if choice.finish_reason:
                res.finish_reason = choice.finish_reason

    async def scrape_metrics(self) -> str | None:
        import httpx

        headers = {"Authorization": f"Bearer {self.cfg.api_key}"}
        url = metrics_url(self.cfg.base_url)
        try:
            if self._http is not None:
                r = await self._http.get(url, headers=headers)
            else:
                async with httpx.AsyncClient(timeout=10) as http:
                    r = await http.get(url, headers=headers)
        except Exception as exc:  # no /metrics is not fatal: the cache rate stays empty
            logger.info("%s: no /metrics (%s)", self.name, exc)
            return None
        return r.text if r.status_code == 200 else None

    async def close(self) -> None:
        await self.client.close()


def _as_text(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)
