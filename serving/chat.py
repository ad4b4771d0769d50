"""Chat completions: the part of the endpoint that vLLM does not do for us.

Requests without tools (or with ``tool_choice="none"``) go to vLLM's own chat endpoint
unchanged, except that a ``response_format`` JSON schema is swapped for our Outlines regex
(which enforces numeric bounds). Requests that may call tools take our path:

* ``required`` / named - the prompt ends with ``<tool_call>\\n`` and vLLM's outlines backend
  enforces `tool_call_regex` over the offered tools (or the named one).
* ``auto`` - a *lazy constraint*: the model writes freely; `IntentDetector` watches for the
  start of a call (``<tool_call>``, a ```json fence, a bare ``{"name": ...}``). Then the free
  stream is dropped (vLLM aborts it) and the call is generated again under the constraint
  from the text before it, which the prefix cache makes cheap. Text replies stream through.

Every argument string is parsed and validated with jsonschema before it leaves the server.
For schemas the regex enforces exactly that check cannot fail; for the others (``multipleOf``,
``uniqueItems``, ...) a failure is regenerated, and after `MAX_ATTEMPTS` refused (502).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from serving.constraint import CompiledSchema, compile_schema, tool_call_regex
from serving.engine import Engine, sse_json
from serving.exceptions import InvalidRequest, ToolCallValidationError
from serving.metrics import Metrics
from serving.prompt import TOOL_CALL_OPEN, PromptBuilder
from serving.protocol import (
    ChatCompletionRequest,
    NamedToolChoice,
    chat_chunk,
    chat_response,
    completion_id,
    tool_call_dict,
)
from serving.schema_cache import SchemaCache
from serving.toolcalls import CallStreamParser, IntentDetector, ParsedCall, parse_lenient

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
_SAMPLING_KEYS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
_CHAT_ONLY = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "stop",
    "loopstack", "logprobs", "top_logprobs", "user", "store", "metadata",
}  # fmt: skip


@dataclass
class ToolPlan:
    """What one tool request resolved to."""

    mode: str  # "required" | "named" | "auto"
    tools: dict[str, CompiledSchema]
    regex: str
    constrained: bool
    prompt: str
    prompt_tokens: int
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.tools.values())


@dataclass
class Generation:
    calls: list[ParsedCall]
    content: str | None
    finish_reason: str
    completion_tokens: int


class ChatService:
    def __init__(
        self,
        engine: Engine,
        prompts: PromptBuilder,
        *,
        schemas: SchemaCache,
        metrics: Metrics,
        max_tool_tokens: int = 1024,
    ):
        self.engine = engine
        self.prompts = prompts
        self.schemas = schemas
        self.metrics = metrics
        self.max_tool_tokens = max_tool_tokens

    # -- entry point ----------------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        choice = req.effective_tool_choice()
        compiled = self._compile_tools(req)
        if choice == "none":
            return await self._passthrough(req)
        if req.n != 1:
            raise InvalidRequest("n must be 1 when tools may be called", param="n")
        if req.response_format is not None and req.response_format.type != "text":
            raise InvalidRequest(
                "response_format cannot be combined with tools", param="response_format"
            )
        plan = self._plan(req, choice, compiled)
        self.metrics.tool_requests.labels(mode=plan.mode).inc()
        if req.stream:
            return self._stream_tools(req, plan)
        gen = await self._generate_tools(plan)
        self._count_calls(plan, gen.calls)
        usage = _usage(plan.prompt_tokens, gen.completion_tokens)
        calls = [tool_call_dict(c.id, c.name, c.arguments) for c in gen.calls]
        return chat_response(
            id_=completion_id(),
            model=req.model,
            content=gen.content,
            tool_calls=calls,
            finish_reason=gen.finish_reason,
            usage=usage,
        )

    def _compile_tools(self, req: ChatCompletionRequest) -> dict[str, CompiledSchema]:
        compiled: dict[str, CompiledSchema] = {}
        for i, tool in enumerate(req.tools or []):
            fn = tool.function
            if fn.name in compiled:
                raise InvalidRequest(f"duplicate tool name {fn.name!r}", param=f"tools[{i}]")
            compiled[fn.name] = self.schemas.get(
                fn.parameters, what=f"tools[{i}].function.parameters"
            )
        return compiled

    def _plan(
        self,
        req: ChatCompletionRequest,
        choice: str | NamedToolChoice,
        compiled: dict[str, CompiledSchema],
    ) -> ToolPlan:
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in compiled:
                raise InvalidRequest(
                    f"tool_choice names {name!r}, which is not among the tools",
                    param="tool_choice",
                )
            mode, offered = "named", {name: compiled[name]}
        else:
            mode, offered = choice, compiled
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        prompt = self.prompts.render(messages, tools)
        max_tokens = req.completion_limit or self.max_tool_tokens
        prompt_tokens = self.prompts.check_fits(prompt, max_tokens)
        sampling = {k: getattr(req, k) for k in _SAMPLING_KEYS if getattr(req, k) is not None}
        extra = {k: v for k, v in (req.model_extra or {}).items() if k not in _CHAT_ONLY}
        return ToolPlan(
            mode=mode,
            tools=offered,
            regex=tool_call_regex(offered, parallel=req.parallel_tool_calls),
            constrained=req.loopstack.constrained,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            sampling={**extra, **sampling},
        )

    # -- pass-through -------------------------------------------------------------------
    async def _passthrough(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        body = req.model_dump(exclude={"loopstack"}, exclude_none=True, by_alias=True)
        body["model"] = self.engine.model_name
        schema: CompiledSchema | None = None
        rf = req.response_format
        if rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
            schema = self.schemas.get(rf.json_schema.schema_, what="response_format.json_schema")
            if req.loopstack.constrained:
                del body["response_format"]
                body["structured_outputs"] = {"regex": schema.regex}
        if req.stream:
            return self._relay(body)
        for attempt in range(MAX_ATTEMPTS):
            resp = await self.engine.post("/v1/chat/completions", body)
            resp["model"] = req.model
            if schema is None or not req.loopstack.constrained:
                return resp
            bad = _invalid_json_choices(resp, schema)
            if not bad:
                return resp
            logger.warning("response_format output failed its schema (attempt %d)", attempt + 1)
            body = {**body, "temperature": max(body.get("temperature", 0.0), 0.7), "seed": attempt}
        raise ToolCallValidationError("the model did not produce output valid for the schema")

    async def _relay(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        async for line in self.engine.stream("/v1/chat/completions", body):
            yield line + b"\n\n"

    # -- tool calls, whole ----------------------------------------------------------------
    async def _generate_tools(self, plan: ToolPlan) -> Generation:
        if plan.mode != "auto":
            return await self._constrained(plan, plan.prompt, content=None, used_tokens=0)
        detector = IntentDetector()
        finish, tokens = "stop", 0
        async for text, reason in self._free(plan):
            tokens += 1
            _, intent = detector.feed(text)
            if intent is not None and plan.constrained:
                self.metrics.auto_switches.inc()
                return await self._constrained(
                    plan, plan.prompt + _join(intent.text_before), intent.text_before or None,
                    used_tokens=tokens,
                )  # fmt: skip
            finish = reason or finish
        if not plan.constrained:
            return self._lenient(plan, detector.text, tokens, finish)
        return Generation([], detector.text, finish, tokens)

    async def _constrained(
        self, plan: ToolPlan, prompt: str, content: str | None, used_tokens: int
    ) -> Generation:
        body = self._completion_body(plan, prompt + TOOL_CALL_OPEN)
        if not plan.constrained:
            resp = await self.engine.post("/v1/completions", body)
            choice = resp["choices"][0]
            gen = self._lenient(plan, TOOL_CALL_OPEN + choice["text"], 0, choice["finish_reason"])
            gen.completion_tokens = used_tokens + resp["usage"]["completion_tokens"]
            return gen
        for attempt in range(MAX_ATTEMPTS):
            resp = await self.engine.post("/v1/completions", body)
            choice = resp["choices"][0]
            parser = CallStreamParser()
            parser.feed(choice["text"])
            calls = [c for c in parser.calls if c.complete]
            tokens = used_tokens + resp["usage"]["completion_tokens"]
            if choice["finish_reason"] == "length" and not calls:
                return Generation([], content, "length", tokens)
            problems = [p for c in calls for p in self._problems(plan, c)]
            if not problems:
                return Generation(calls, content, "tool_calls", tokens)
            self.metrics.tool_retries.inc()
            logger.warning("tool call failed validation (attempt %d): %s", attempt + 1, problems)
            temp = max(float(body.get("temperature", 0.0)), 0.7)
            body = {**body, "temperature": temp, "seed": attempt + 1}
        raise ToolCallValidationError(
            "the model did not produce tool-call arguments valid for the schema"
        )

    def _lenient(self, plan: ToolPlan, text: str, tokens: int, finish: str) -> Generation:
        """Unconstrained baseline: whatever calls can be read out of the text, unvalidated."""
        found = parse_lenient(text)
        calls = [
            ParsedCall(
                i, f"call_{i}", name, args if isinstance(args, str) else json.dumps(args), True
            )
            for i, (name, args) in enumerate(found)
        ]
        if calls:
            return Generation(calls, None, "tool_calls", tokens)
        return Generation([], text, finish, tokens)

    def _problems(self, plan: ToolPlan, call: ParsedCall) -> list[str]:
        schema = plan.tools.get(call.name)
        if schema is None:
            return [f"unknown tool {call.name!r}"]
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError as exc:
            return [f"arguments are not JSON: {exc}"]
        return schema.errors(args)

    def _completion_body(self, plan: ToolPlan, prompt: str, *, free: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            **plan.sampling,
            "model": self.engine.model_name,
            "prompt": prompt,
            "max_tokens": plan.max_tokens,
            "skip_special_tokens": False,
        }
        if not free and plan.constrained:
            body["structured_outputs"] = {"regex": plan.regex}
        return body

    async def _free(self, plan: ToolPlan) -> AsyncIterator[tuple[str, str | None]]:
        """Unconstrained streaming generation: (text delta, finish_reason) per engine chunk."""
        body = {**self._completion_body(plan, plan.prompt, free=True), "stream": True}
        async for chunk in sse_json(self.engine.stream("/v1/completions", body)):
            for choice in chunk.get("choices", []):
                yield choice.get("text", ""), choice.get("finish_reason")

    def _count_calls(self, plan: ToolPlan, calls: list[ParsedCall]) -> None:
        for c in calls:
            ok = not self._problems(plan, c)
            self.metrics.tool_calls.labels(mode=plan.mode, valid=str(ok).lower()).inc()

    # -- tool calls, streamed -------------------------------------------------------------
    async def _stream_tools(self, req: ChatCompletionRequest, plan: ToolPlan) -> AsyncIterator[bytes]:
        id_, model = completion_id(), req.model

        def sse(**kw: Any) -> bytes:
            return b"data: " + json.dumps(chat_chunk(id_=id_, model=model, **kw)).encode() + b"\n\n"

        yield sse(delta={"role": "assistant", "content": ""})
        if not plan.constrained:  # benchmark baseline: generate whole, then replay as chunks
            gen = await self._generate_tools(plan)
            if gen.content:
                yield sse(delta={"content": gen.content})
            for c in gen.calls:
                yield sse(delta={"tool_calls": [_full_delta(c)]})
            yield sse(finish_reason=gen.finish_reason)
            if req.include_usage:
                yield sse(usage=_usage(plan.prompt_tokens, gen.completion_tokens))
            yield b"data: [DONE]\n\n"
            return
        tokens, content, finish = 0, None, "stop"
        prompt = plan.prompt
        if plan.mode == "auto":
            detector, sent, intent = IntentDetector(), 0, None
            async for text, reason in self._free(plan):
                tokens += 1
                safe, intent = detector.feed(text)
                if safe > sent:
                    yield sse(delta={"content": detector.text[sent:safe]})
                    sent = safe
                if intent is not None:
                    break
                finish = reason or finish
            if intent is None:
                if len(detector.text) > sent:
                    yield sse(delta={"content": detector.text[sent:]})
                yield sse(finish_reason=finish)
                if req.include_usage:
                    yield sse(usage=_usage(plan.prompt_tokens, tokens))
                yield b"data: [DONE]\n\n"
                return
            self.metrics.auto_switches.inc()
            content = intent.text_before
            prompt = plan.prompt + _join(content)
        if not plan.exact:  # validate whole calls (and retry) before anything is sent
            gen = await self._constrained(plan, prompt, content, used_tokens=tokens)
            for c in gen.calls:
                yield sse(delta={"tool_calls": [_full_delta(c)]})
            self._count_calls(plan, gen.calls)
            finish, tokens = gen.finish_reason, gen.completion_tokens
        else:
            parser = CallStreamParser()
            body = {**self._completion_body(plan, prompt + TOOL_CALL_OPEN), "stream": True}
            body["stream_options"] = {"include_usage": True}
            finish = "tool_calls"
            async for chunk in sse_json(self.engine.stream("/v1/completions", body)):
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    for ev in parser.feed(choice.get("text", "")):
                        d: dict[str, Any] = {"index": ev.index}
                        if ev.name is not None:
                            d.update(id=ev.id, type="function")
                            d["function"] = {"name": ev.name, "arguments": ev.arguments_delta}
                        else:
                            d["function"] = {"arguments": ev.arguments_delta}
                        yield sse(delta={"tool_calls": [d]})
                    if choice.get("finish_reason") == "length":
                        finish = "length"
            self._count_calls(plan, [c for c in parser.calls if c.complete])
        yield sse(finish_reason=finish)
        if req.include_usage:
            yield sse(usage=_usage(plan.prompt_tokens, tokens))
        yield b"data: [DONE]\n\n"


def _join(text_before: str) -> str:
    return text_before + "\n" if text_before else ""


def _full_delta(c: ParsedCall) -> dict[str, Any]:
    fn = {"name": c.name, "arguments": c.arguments}
    return {"index": c.index, "id": c.id, "type": "function", "function": fn}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _invalid_json_choices(resp: dict[str, Any], schema: CompiledSchema) -> list[int]:
    bad = []
    for choice in resp.get("choices", []):
        if choice.get("finish_reason") == "length":
            continue  # truncated output is reported as such, not as a schema failure
        try:
            value = json.loads(choice["message"]["content"] or "")
        except (json.JSONDecodeError, KeyError, TypeError):
            bad.append(choice.get("index", 0))
            continue
        if schema.errors(value):
            bad.append(choice.get("index", 0))
    return bad
