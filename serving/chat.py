"""Chat completions: the part of the endpoint that vLLM does not do for us.

Requests without tools (or with ``tool_choice="none"``) go to vLLM's own chat endpoint
unchanged, except that every client constraint (``response_format``, ``structured_outputs``)
is admitted through the constraint backend first (`serving.client_constraints`) and an
output that fails its schema is generated again (`REGENERATE`). Requests that may call
tools take our path, in ``auto``, ``required`` and named modes, streamed or whole, in one
pipeline:

1. the tools, ranked (``loopstack.tool_rank``) and admitted by the backend
   (`ConstraintBackend.tool_schema`: checked, repaired where a schema has one reading);
2. the plan (`ToolPlan`): mode, rendered prompt, sampling, the calls already answered
   (``loopstack.no_repeat``);
3. the backend's `admit`: the turn's constraint, compiled first (a 400 here, before any
   reply is sent);
4. the backend's `turn`: **the whole turn** as events (`serving.constraint`) - or, with
   ``extra_body={"loopstack": {"constrained": false}}`` (the benchmarks' baseline), no
   constraint at all, calls read leniently from the text (`baseline_turn`);
5. the reply assembled from the events, whole or as SSE, and the tool metrics counted from
   them (`_events`, the one place).

Every argument string is parsed and validated with jsonschema before it leaves the server;
for schemas the backend does not enforce exactly a failing turn is regenerated, and after
`MAX_ATTEMPTS` refused (502).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, Literal

from serving.client_constraints import admit_constraints, client_constraint
from serving.constraint.backend import ConstraintBackend
from serving.constraint.schemas import CompiledSchema
from serving.constraint.turn import (
    MAX_ATTEMPTS,
    REGENERATE,
    AutoSwitch,
    ContentDelta,
    Done,
    Retry,
    ToolMode,
    ToolPlan,
    baseline_turn,
)
from serving.engine import Engine
from serving.exceptions import InvalidRequest
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
from serving.schema_limits import repair_schema
from serving.selection_defaults import (
    DECIDE_RULE,
    SelectionDefaults,
    hide_decision,
    with_rule,
)
from serving.tool_rank import ToolRanker
from serving.tool_selection import executed_calls, rank_request, with_abstain_rule
from serving.toolcalls import CallEvent

__all__ = ["MAX_ATTEMPTS", "RESPONSE_HEADERS", "ChatService"]

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
        backend: ConstraintBackend,
        metrics: Metrics,
        max_tool_tokens: int = 1024,
        ranker: ToolRanker | None = None,
        selection: SelectionDefaults | None = None,
    ):
        self.engine = engine
        self.prompts = prompts
        self.backend = backend  # built complete by `serving.constraint.factory`
        self.metrics = metrics
        self.max_tool_tokens = max_tool_tokens
        self.ranker = ranker  # `loopstack.tool_rank` (None: the extension is refused)
        # what a request that does not say gets (serving.selection_defaults)
        self.selection = selection or SelectionDefaults()

    # -- entry point ----------------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        req, applied = self.selection.apply(req)
        if applied:
            _say("x-loopstack-selection", "server defaults: " + ",".join(applied))
        if req.loopstack.tool_rank is not None and req.tools:
            if self.ranker is None:
                raise InvalidRequest(
                    "loopstack.tool_rank needs the server's embedding model", param="loopstack"
                )
            req = await rank_request(req, self.ranker)
            _say("x-loopstack-tools-offered", ",".join(t.function.name for t in req.tools or []))
        choice = req.effective_tool_choice()
        compiled = await self._admit_tools(req)
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
        if plan.constrained:
            admitted = await self.backend.admit(plan)
            if admitted is None:  # every call the model could make was made: text only
                plain = {"tools": None, "tool_choice": None}
                return await self._passthrough(req.model_copy(update=plain))
            plan = admitted
        self.metrics.tool_requests.labels(mode=plan.mode).inc()
        if req.stream:
            return self._stream_tools(req, plan)
        return await self._complete_tools(req, plan)

    async def _admit_tools(self, req: ChatCompletionRequest) -> dict[str, CompiledSchema]:
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
            compiled[fn.name] = await self.backend.tool_schema(
                params, what=what, enforced=req.loopstack.constrained
            )
        if repaired:
            _say("x-loopstack-schema-repaired", " | ".join(repaired))
        return compiled

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
        answered = executed_calls(messages) if req.loopstack.no_repeat else {}
        if req.loopstack.abstain:
            messages = with_abstain_rule(messages)
        # the decision before the call: auto turns of a backend whose grammar writes it
        decide = req.loopstack.decide and mode == "auto" and getattr(self.backend, "decides", False)
        if decide:
            messages = with_rule(messages, DECIDE_RULE)
        prompt = self.prompts.render(messages, tools)
        max_tokens = req.completion_limit or self.max_tool_tokens
        prompt_tokens = self.prompts.check_fits(prompt, max_tokens)
        sampling = {k: getattr(req, k) for k in _SAMPLING_KEYS if getattr(req, k) is not None}
        extra = {k: v for k, v in (req.model_extra or {}).items() if k not in _CHAT_ONLY}
        return ToolPlan(
            mode=mode,
            tools=offered,
            constrained=req.loopstack.constrained,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            sampling={**extra, **sampling},
            parallel=req.parallel_tool_calls,
            stream=req.stream,
            answered=answered,
            decide=decide,
        )

    # -- pass-through -------------------------------------------------------------------
    async def _passthrough(
        self, req: ChatCompletionRequest
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        body = req.model_dump(exclude={"loopstack"}, exclude_none=True, by_alias=True)
        body["model"] = self.engine.model_name
        # Every client constraint (response_format, structured_outputs, guided_*) is admitted
        # by the backend, or refused; unconstrained (benchmark baseline): none is sent.
        admitted = await admit_constraints(
            body, self.backend, constrained=req.loopstack.constrained
        )
        body, schema = admitted.body, admitted.schema
        if req.stream:
            return self._relay(body)
        temperature = float(body.get("temperature") or 0.0)
        for attempt in range(REGENERATE.attempts):
            sent = {**body, **REGENERATE.sampling(attempt, temperature)}
            resp = await self.engine.post("/v1/chat/completions", sent)
            resp["model"] = req.model
            if schema is None or not req.loopstack.constrained:
                return resp
            if not await _invalid_json_choices(resp, schema):
                return resp
            logger.warning("response_format output failed its schema (attempt %d)", attempt + 1)
        raise REGENERATE.exhausted("output")

    async def _relay(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        async for line in self.engine.stream("/v1/chat/completions", body):
            yield line + b"\n\n"

    async def admit_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A /v1/completions body with its client constraint admitted (or InvalidRequest)."""
        return (await admit_constraints(body, self.backend)).body

    # -- tool calls ---------------------------------------------------------------------
    async def _events(self, plan: ToolPlan) -> AsyncIterator[ContentDelta | CallEvent | Done]:
        """The reply as events: content text, tool-call deltas, then Done - the backend's
        whole turn (the baseline's without one). The one place the tool metrics count."""
        if plan.constrained:
            turn = self.backend.turn(plan, self.engine)
        else:
            turn = baseline_turn(plan, self.engine)
        if plan.decide:  # the decision line is the grammar's, never the client's
            turn = hide_decision(turn)
        async for ev in turn:
            if isinstance(ev, Retry):
                self.metrics.tool_retries.inc()
            elif isinstance(ev, AutoSwitch):
                self.metrics.auto_switches.inc()
            else:
                if isinstance(ev, Done) and plan.constrained:
                    calls = self.metrics.tool_calls
                    calls.labels(mode=plan.mode, valid="true").inc(ev.calls - ev.invalid)
                    calls.labels(mode=plan.mode, valid="false").inc(ev.invalid)
                yield ev

    # -- assembling responses -------------------------------------------------------------
    async def _complete_tools(self, req: ChatCompletionRequest, plan: ToolPlan) -> dict[str, Any]:
        content, done = "", Done("stop", 0)
        calls: dict[int, dict[str, Any]] = {}
        async for ev in self._events(plan):
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
        async for ev in self._events(plan):
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
