"""Chat completions: the part of the endpoint that vLLM does not do for us.

Requests without tools (or with ``tool_choice="none"``) go to vLLM's own chat endpoint
unchanged, except that every client constraint (``response_format``, ``structured_outputs``)
is admitted like a tool schema first. Requests that may call tools take our path, in
``auto``, ``required`` and named modes, streamed or whole:

* with a grammar backend (``guidance``, the default, or ``xgrammar``;
  `serving.constraint_backend`), the whole turn - text, then one or more calls, each under
  its tool's schema - is **one engine request** under one constraint, read back by
  `serving.turn`;
* with ``outlines``, the older path: a call in two requests (head, then arguments), ``auto``
  by watching free text (`serving.backend_outlines`);
* unconstrained (``extra_body={"loopstack": {"constrained": false}}``, the benchmarks'
  baseline): no grammar, calls read leniently from the text.

Every argument string is parsed and validated with jsonschema before it leaves the server.
For schemas the backend enforces exactly that check cannot fail; for the others
(``multipleOf``, ``uniqueItems``, ...) a failing turn is regenerated, and after
`MAX_ATTEMPTS` refused (502).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextvars import ContextVar
from typing import Any, Literal

from serving.backend_outlines import OutlinesBackend
from serving.client_constraints import admit_constraints, client_constraint
from serving.constraint import CompiledSchema
from serving.constraint_backend import (
    ConstraintBackend,
    ToolMode,
    TurnSpec,
    refuse_unenforceable,
)
from serving.engine import Engine, UpstreamError, sse_json
from serving.envelope import TOOL_CALL_OPEN
from serving.exceptions import InvalidRequest, ToolCallValidationError
from serving.metrics import Metrics
from serving.prompt import PromptBuilder
from serving.protocol import (
    ChatCompletionRequest,
    NamedToolChoice,
    chat_chunk,
    chat_response,
    completion_id,
    tool_call_dict,
)
from serving.schema_cache import SchemaCache
from serving.schema_limits import repair_schema
from serving.tool_rank import ToolRanker
from serving.tool_selection import (
    excluding,
    executed_calls,
    rank_request,
    with_abstain_rule,
)
from serving.toolcalls import CallEvent, ParsedCall, new_call_id, parse_lenient
from serving.turn import (
    MAX_ATTEMPTS,
    ContentDelta,
    Done,
    Event,
    Tally,
    ToolPlan,
    TurnRequest,
    turn_events,
)

logger = logging.getLogger(__name__)

# Headers the reply carries (set per request by `serving.api`: a dict the handler fills)
RESPONSE_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("response_headers", default=None)


def _say(header: str, value: str) -> None:
    headers = RESPONSE_HEADERS.get()
    if headers is not None:
        headers[header] = value[:1000]


_SAMPLING_KEYS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
_CHAT_ONLY = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "stop",
    "loopstack", "logprobs", "top_logprobs", "user", "store", "metadata",
}  # fmt: skip


class ChatService:
    def __init__(
        self,
        engine: Engine,
        prompts: PromptBuilder,
        *,
        schemas: SchemaCache,
        metrics: Metrics,
        max_tool_tokens: int = 1024,
        backend: ConstraintBackend | None = None,
        ranker: ToolRanker | None = None,
    ):
        self.engine = engine
        self.prompts = prompts
        self.schemas = schemas
        self.metrics = metrics
        self.max_tool_tokens = max_tool_tokens
        self.backend: ConstraintBackend = backend or OutlinesBackend()
        self.ranker = ranker  # `loopstack.tool_rank` (None: the extension is refused)

    # -- entry point ----------------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        if req.loopstack.tool_rank is not None and req.tools:
            if self.ranker is None:
                raise InvalidRequest(
                    "loopstack.tool_rank needs the server's embedding model", param="loopstack"
                )
            req = await rank_request(req, self.ranker)
            _say("x-loopstack-tools-offered", ",".join(t.function.name for t in req.tools or []))
        choice = req.effective_tool_choice()
        compiled = await self._compile_tools(req)
        if choice == "none":
            return await self._passthrough(req)
        if req.n != 1:
            raise InvalidRequest("n must be 1 when tools may be called", param="n")
        if req.response_format is not None and req.response_format.type != "text":
            raise InvalidRequest(
                "response_format cannot be combined with tools", param="response_format"
            )
        found = client_constraint(req.model_extra or {})
        if found is not None:  # the tool path constrains itself, the free phase of auto too
            raise InvalidRequest(f"{found[0]} cannot be combined with tools", param=found[0])
        plan = self._plan(req, choice, compiled)
        if self.backend.single_request and plan.constrained:
            schemas = {n: c.schema for n, c in plan.tools.items()}
            if req.loopstack.no_repeat:
                schemas = self._without_repeats(req, schemas, plan.mode)
                if not schemas:  # every call the model could make was made: text only
                    plain = {"tools": None, "tool_choice": None}
                    return await self._passthrough(req.model_copy(update=plain))
            spec = TurnSpec(plan.mode, schemas, plan.parallel)
            plan.constraint = await self.backend.admit(spec, what="tools")
        self.metrics.tool_requests.labels(mode=plan.mode).inc()
        if req.stream:
            return self._stream_tools(req, plan)
        return await self._complete_tools(req, plan)

    async def _compile_tools(self, req: ChatCompletionRequest) -> dict[str, CompiledSchema]:
        compiled: dict[str, CompiledSchema] = {}
        repaired = []
        for i, tool in enumerate(req.tools or []):
            fn = tool.function
            if fn.name in compiled:
                raise InvalidRequest(f"duplicate tool name {fn.name!r}", param=f"tools[{i}]")
            what = f"tools[{i}].function.parameters"
            params, notes = repair_schema(fn.parameters)
            if notes:  # one reading: constrained and validated by the repaired schema
                repaired.append(f"{fn.name}: {'; '.join(notes)}")
                logger.warning("%s (%s) repaired: %s", what, fn.name, "; ".join(notes))
            if not req.loopstack.constrained:  # the baseline: validated, never enforced
                compiled[fn.name] = await self.schemas.checked(params, what=what)
                continue
            refuse_unenforceable(params, what=what)
            if self.backend.single_request:
                compiled[fn.name] = await self.schemas.checked(
                    params, what=what, exact=self.backend.exact
                )
            else:
                compiled[fn.name] = await self.schemas.get(params, what=what)
        if repaired:
            _say("x-loopstack-schema-repaired", " | ".join(repaired))
        return compiled

    def _without_repeats(
        self, req: ChatCompletionRequest, schemas: dict[str, Any], mode: ToolMode
    ) -> dict[str, Any]:
        """`schemas` minus the calls already answered (``loopstack.no_repeat``)."""
        done = executed_calls([m.model_dump(exclude_none=True) for m in req.messages])
        out = {}
        for name, schema in schemas.items():
            left = excluding(schema, done.get(name, []))
            if left is not None:
                out[name] = left
        if len(out) < len(schemas) or any(out[n] is not schemas[n] for n in out):
            logger.info("no_repeat: %d answered call(s) excluded", sum(map(len, done.values())))
        if not out and mode != "auto":
            raise InvalidRequest(
                "every call the tools admit was already made and answered (loopstack.no_repeat)",
                param="tool_choice",
            )
        return out

    def _plan(
        self,
        req: ChatCompletionRequest,
        choice: Literal["auto", "required"] | NamedToolChoice,
        compiled: dict[str, CompiledSchema],
    ) -> ToolPlan:
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in compiled:
                raise InvalidRequest(
                    f"tool_choice names {name!r}, which is not among the tools",
                    param="tool_choice",
                )
            mode: ToolMode = "named"
            offered = {name: compiled[name]}
        else:
            mode, offered = choice, compiled
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        if req.loopstack.abstain:
            messages = with_abstain_rule(messages)
        prompt = self.prompts.render(messages, tools)
        max_tokens = req.completion_limit or self.max_tool_tokens
        prompt_tokens = self.prompts.check_fits(prompt, max_tokens)
        sampling = {k: getattr(req, k) for k in _SAMPLING_KEYS if getattr(req, k) is not None}
        extra = {k: v for k, v in (req.model_extra or {}).items() if k not in _CHAT_ONLY}
        regexes = None
        if isinstance(self.backend, OutlinesBackend) and req.loopstack.constrained:
            regexes = self.backend.regexes(offered, parallel=req.parallel_tool_calls)
        return ToolPlan(
            mode=mode,
            tools=offered,
            regexes=regexes,
            parallel=req.parallel_tool_calls,
            constrained=req.loopstack.constrained,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            sampling={**extra, **sampling},
        )

    # -- pass-through -------------------------------------------------------------------
    async def _passthrough(
        self, req: ChatCompletionRequest
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        body = req.model_dump(exclude={"loopstack"}, exclude_none=True, by_alias=True)
        body["model"] = self.engine.model_name
        # Every client constraint (response_format, structured_outputs, guided_*) is admitted
        # like a tool schema, or refused; unconstrained (benchmark baseline): none is sent.
        admitted = await admit_constraints(
            body, self.schemas, constrained=req.loopstack.constrained
        )
        body, schema = admitted.body, admitted.schema
        if req.stream:
            return self._relay(body)
        for attempt in range(MAX_ATTEMPTS):
            resp = await self.engine.post("/v1/chat/completions", body)
            resp["model"] = req.model
            if schema is None or not req.loopstack.constrained:
                return resp
            bad = await _invalid_json_choices(resp, schema)
            if not bad:
                return resp
            logger.warning("response_format output failed its schema (attempt %d)", attempt + 1)
            body = {**body, "temperature": max(body.get("temperature", 0.0), 0.7), "seed": attempt}
        raise ToolCallValidationError("the model did not produce output valid for the schema")

    async def _relay(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        async for line in self.engine.stream("/v1/chat/completions", body):
            yield line + b"\n\n"

    # -- tool calls ---------------------------------------------------------------------
    async def _events(self, plan: ToolPlan, *, live: bool) -> AsyncIterator[Event]:
        """The reply as events: content text, tool-call deltas, then Done.

        `live` streams call arguments as they are generated (when the regex enforces the
        schemas exactly); otherwise whole calls are validated - and regenerated if needed -
        before they are emitted.
        """
        tally = Tally()
        if plan.constraint is not None:
            async for ev in self._turn_events(plan, tally, live=live):
                yield ev
            return
        if not plan.constrained:  # benchmark baseline: no grammar, calls read leniently
            prefix = "" if plan.mode == "auto" else TOOL_CALL_OPEN
            body = self.engine_body(plan, plan.prompt + prefix, regex=None, tally=tally)
            text = prefix + "".join([d async for d in self.stream_text(body, tally)])
            found = parse_lenient(text)
            if not found:
                yield ContentDelta(text)
            for i, (name, args) in enumerate(found):
                raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                yield CallEvent(i, new_call_id(), name=name, arguments_delta=raw)
            yield Done("tool_calls" if found else tally.finish, tally.tokens, tally.cached)
            return
        assert isinstance(self.backend, OutlinesBackend)
        async for ev in self.backend.events(self, plan, tally, live=live):
            yield ev

    async def admit_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A /v1/completions body with its client constraint admitted (or InvalidRequest)."""
        return (await admit_constraints(body, self.schemas)).body

    async def problems(self, plan: ToolPlan, call: ParsedCall) -> list[str]:
        schema = plan.tools.get(call.name)
        if schema is None:
            return [f"unknown tool {call.name!r}"]
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError as exc:
            return [f"arguments are not JSON: {exc}"]
        return await schema.errors_off_loop(args)

    async def check_sent(self, plan: ToolPlan, calls: list[ParsedCall]) -> int:
        """Streamed calls were sent as generated (the regex enforces their schema exactly);
        check them anyway, so a gap in that guarantee shows in logs and metrics."""
        invalid = 0
        for c in calls:
            if await self.problems(plan, c):
                invalid += 1
                logger.error("invalid tool call left the server: %s %s", c.name, c.arguments)
        self.metrics.tool_calls.labels(mode=plan.mode, valid="false").inc(invalid)
        return invalid

    async def _turn_events(
        self, plan: ToolPlan, tally: Tally, *, live: bool
    ) -> AsyncIterator[Event]:
        """One engine request for the whole turn (`serving.turn`)."""
        prompt = plan.prompt + ("" if plan.mode == "auto" else TOOL_CALL_OPEN)
        body = self.engine_body(plan, prompt, regex=None, tally=tally)
        body["structured_outputs"] = plan.constraint
        turn = TurnRequest(
            names=list(plan.tools),
            auto=plan.mode == "auto",
            parallel=plan.parallel,
            exact=plan.exact,
            body=body,
            temperature=float(plan.sampling.get("temperature") or 0.0),
        )

        async def problems(call: ParsedCall) -> list[str]:
            return await self.problems(plan, call)

        try:
            async for ev in turn_events(
                turn, stream=self.stream_text, problems=problems, tally=tally, live=live
            ):
                yield ev
        except UpstreamError as exc:
            if exc.status_code < 500:
                raise
            raise ToolCallValidationError(
                f"the engine failed while generating under the tools' constraint: {exc.message}"
            ) from exc
        finally:
            self.metrics.tool_retries.inc(tally.retries)
        valid = tally.calls - tally.invalid
        self.metrics.tool_calls.labels(mode=plan.mode, valid="true").inc(valid)
        self.metrics.tool_calls.labels(mode=plan.mode, valid="false").inc(tally.invalid)

    def engine_body(
        self, plan: ToolPlan, prompt: str, *, regex: str | None, tally: Tally
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            **plan.sampling,
            "model": self.engine.model_name,
            "prompt": prompt,
            "max_tokens": plan.max_tokens - tally.tokens,
            "skip_special_tokens": False,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if regex is not None:
            body["structured_outputs"] = {"regex": regex}
        return body

    async def stream_text(self, body: dict[str, Any], tally: Tally) -> AsyncGenerator[str]:
        """Text deltas of one streamed completion; keeps the token count and finish reason.
        Leaving the loop early closes the stream, which makes vLLM abort the request."""
        chunks, counted = 0, False
        events = sse_json(self.engine.stream("/v1/completions", body))
        try:
            async for chunk in events:
                if chunk.get("usage"):
                    tally.tokens += int(chunk["usage"]["completion_tokens"])
                    counted = True
                    details = chunk["usage"].get("prompt_tokens_details") or {}
                    if tally.cached is None and details.get("cached_tokens") is not None:
                        tally.cached = int(details["cached_tokens"])
                for choice in chunk.get("choices", []):
                    chunks += 1
                    if choice.get("finish_reason"):
                        tally.finish = choice["finish_reason"]
                    if choice.get("text"):
                        yield choice["text"]
        finally:
            await events.aclose()
            if not counted:  # aborted early: one chunk is one token in vLLM's stream
                tally.tokens += chunks

    # -- assembling responses -------------------------------------------------------------
    async def _complete_tools(self, req: ChatCompletionRequest, plan: ToolPlan) -> dict[str, Any]:
        content, done = "", Done("stop", 0)
        calls: dict[int, dict[str, Any]] = {}
        async for ev in self._events(plan, live=False):
            if isinstance(ev, ContentDelta):
                content += ev.text
            elif isinstance(ev, CallEvent):
                call = calls.setdefault(ev.index, tool_call_dict(ev.id, ev.name or "", ""))
                call["function"]["arguments"] += ev.arguments_delta
            else:
                done = ev
        return chat_response(
            id_=completion_id(),
            model=req.model,
            content=content.strip() or None if calls else content,
            tool_calls=[calls[i] for i in sorted(calls)],
            finish_reason=done.finish_reason,
            usage=_usage(plan.prompt_tokens, done.completion_tokens, done.cached_tokens),
        )

    async def _stream_tools(
        self, req: ChatCompletionRequest, plan: ToolPlan
    ) -> AsyncIterator[bytes]:
        id_, model = completion_id(), req.model

        def sse(**kw: Any) -> bytes:
            return b"data: " + json.dumps(chat_chunk(id_=id_, model=model, **kw)).encode() + b"\n\n"

        yield sse(delta={"role": "assistant", "content": ""})
        async for ev in self._events(plan, live=True):
            if isinstance(ev, ContentDelta):
                yield sse(delta={"content": ev.text})
            elif isinstance(ev, CallEvent):
                d: dict[str, Any] = {
                    "index": ev.index,
                    "function": {"arguments": ev.arguments_delta},
                }
                if ev.name is not None:
                    d.update(id=ev.id, type="function")
                    d["function"]["name"] = ev.name
                yield sse(delta={"tool_calls": [d]})
            else:
                yield sse(finish_reason=ev.finish_reason)
                if req.include_usage:
                    yield sse(
                        usage=_usage(plan.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                    )
        yield b"data: [DONE]\n\n"


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:  # the engine runs with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


async def _invalid_json_choices(resp: dict[str, Any], schema: CompiledSchema) -> list[int]:
    bad = []
    for choice in resp.get("choices", []):
        if choice.get("finish_reason") == "length":
            continue  # truncated output is reported as such, not as a schema failure
        try:
            value = json.loads(choice["message"]["content"] or "")
        except (json.JSONDecodeError, KeyError, TypeError):
            bad.append(choice.get("index", 0))
            continue
        if await schema.errors_off_loop(value):
            bad.append(choice.get("index", 0))
    return bad
