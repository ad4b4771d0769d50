"""What every backend's `resolve(request, transport) -> events` is made of, and the two
backends that constrain nothing of their own.

`resolve` is the one entry of a constraint backend (`Backend.resolve`): given the
chat request (`TurnRequest`) and the transport to the engine it yields the reply as events
(`loopstack.serving.constraint.turn.Event`), owning every step between:

1. admission (`admit_tools`): each tool's parameters checked, repaired where a schema has
   one reading (``x-loopstack-schema-repaired``: a `Header` event), compiled as the backend
   needs; the request's own checks (`check_tool_request`);
2. planning (`plan`): mode, rendered prompt, sampling, the calls already answered
   (``loopstack.no_repeat``) - an immutable `ToolPlan`;
3. the backend's constraint for that plan (a 400 here, before any reply is sent), then
   `Ready`, then the turn under the one regenerate loop (`turn.regenerating`).

Two more backends, so the front-end never branches on how a request is constrained:

* `Baseline` - ``loopstack.constrained: false`` (the benchmarks' baseline): the same
  admission and plan, no constraint at all, calls read leniently (`turn.baseline_turn`);
* `pass_through` - a request without tools (or ``tool_choice="none"``, or ``no_repeat``
  leaving no call to make) goes to vLLM's chat endpoint as it is, its client constraint
  admitted by the configured backend (`client_constraints`) and a ``response_format`` reply
  failing its schema generated again (the same loop); `pass_completion` does the same for
  ``/v1/completions``. Both relay through `transport.relay`, the one relay.

`Resolver.resolve` picks the backend for a request (the configured one, or the baseline).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from loopstack.serving.config import BackendName
from loopstack.serving.constraint.client_constraints import (
    ClientAdmitter,
    admit_constraints,
    client_constraint,
)
from loopstack.serving.constraint.decision import DECIDE_RULE
from loopstack.serving.constraint.no_repeat import executed_calls
from loopstack.serving.constraint.schema_limits import repair_schema
from loopstack.serving.constraint.schemas import CompiledSchema
from loopstack.serving.constraint.turn import (
    REGENERATE,
    Event,
    Header,
    Ready,
    Relay,
    Retry,
    ToolMode,
    ToolPlan,
    Whole,
    baseline_turn,
    regenerating,
)
from loopstack.serving.engine.transport import Transport, collect, relay
from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.protocol import ChatCompletionRequest, NamedToolChoice

logger = logging.getLogger(__name__)


class Backend(ClientAdmitter, Protocol):
    """What resolving a request asks of a constraint backend (`loopstack.serving.constraint.backend.
    ConstraintBackend` adds its lifecycle): its name, a tool schema admitted, a client
    constraint admitted, the whole request resolved."""

    name: BackendName

    def resolve(self, request: TurnRequest, transport: Transport) -> AsyncIterator[Event]: ...
    async def tool_schema(
        self, schema: Any, *, what: str, enforced: bool = True
    ) -> CompiledSchema: ...


CHAT_PATH = "/v1/chat/completions"
_SAMPLING_KEYS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
_CHAT_ONLY = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "stop",
    "loopstack", "logprobs", "top_logprobs", "user", "store", "metadata",
}  # fmt: skip


class Renderer(Protocol):
    """The chat template (`loopstack.serving.prompt.PromptBuilder`): messages and tools as a
    prompt."""

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str: ...
    def check_fits(self, prompt: str, max_tokens: int) -> int: ...


@dataclass(frozen=True)
class TurnRequest:
    """One chat request as a backend resolves it: the validated wire request (never changed:
    a variant is a new value), how its prompt is rendered, the engine's model name, the
    token budget of a tool turn, a rule said in the system message (``abstain``) and one said
    after the conversation (``after_results``: it comes and goes with the turn, so it is kept
    out of the prompt's prefix)."""

    chat: ChatCompletionRequest
    prompts: Renderer
    engine_model: str
    max_tool_tokens: int = 1024
    system_rule: str | None = None
    closing_rule: str | None = None

    @property
    def constrained(self) -> bool:
        return self.chat.loopstack.constrained

    def without_tools(self) -> TurnRequest:
        plain = {"tools": None, "tool_choice": None}
        return replace(self, chat=self.chat.model_copy(update=plain))


@dataclass(frozen=True)
class Admitted:
    """A tool request admitted: its plan (None: ``tool_choice="none"``, passed through) and
    the headers admission says."""

    plan: ToolPlan | None
    headers: tuple[Header, ...] = ()


async def admit(backend: Backend, request: TurnRequest) -> Admitted:
    """Steps 1 and 2: the tools admitted, the request checked, the plan made."""
    compiled, headers = await admit_tools(backend, request)
    req = request.chat
    choice = req.effective_tool_choice()
    if choice == "none":
        return Admitted(None, headers)
    answers = getattr(backend, "answers", False) or not req.loopstack.constrained
    check_tool_request(req, answers=answers, backend=backend.name)
    # a turn that must call ignores response_format (as OpenAI does): admitted for auto only
    answer = await answer_schema(backend, req) if choice == "auto" else None
    decides = getattr(backend, "decides", False)  # writes `loopstack.decide`'s line
    return Admitted(plan(request, choice, compiled, decides=decides, answer=answer), headers)


async def admit_tools(
    backend: Backend, request: TurnRequest
) -> tuple[dict[str, CompiledSchema], tuple[Header, ...]]:
    compiled: dict[str, CompiledSchema] = {}
    repaired = []
    req = request.chat
    for i, tool in enumerate(req.tools or []):
        fn = tool.function
        if fn.name in compiled:
            raise InvalidRequest(f"duplicate tool name {fn.name!r}", param=f"tools[{i}]")
        what = f"tools[{i}].function.parameters"
        params, notes = repair_schema(fn.parameters)
        if notes:  # one reading: constrained and validated by the repaired schema
            repaired.append(f"{fn.name}: {'; '.join(notes)}")
            logger.warning("%s (%s) repaired: %s", what, fn.name, "; ".join(notes))
        compiled[fn.name] = await backend.tool_schema(
            params, what=what, enforced=req.loopstack.constrained
        )
    if repaired:
        return compiled, (Header("x-loopstack-schema-repaired", " | ".join(repaired)),)
    return compiled, ()


def check_tool_request(
    req: ChatCompletionRequest, *, answers: bool = True, backend: str = "guidance"
) -> None:
    """What a request that may call tools cannot also ask for. A ``response_format`` holds
    the answer of an ``auto`` turn that makes no call (`answer_schema`) - where the backend's
    turn grammar can say it (`answers`); a turn that must call ignores it, as OpenAI does."""
    if req.n != 1:
        raise InvalidRequest("n must be 1 when tools may be called", param="n")
    rf = req.response_format
    auto = req.effective_tool_choice() == "auto"
    if rf is not None and rf.type != "text" and not answers and auto:
        raise InvalidRequest(
            f"response_format with tools needs the guidance constraint backend (the {backend} "
            "backend cannot hold an answer to a schema beside tool calls): set "
            "LOOPSTACK_CONSTRAINT_BACKEND=guidance, or send the answer's request without tools",
            param="response_format",
            code="unsupported_constraint",
        )
    found = client_constraint(req.model_extra or {})
    if found is not None:  # the tool path constrains itself, the free phase of auto too
        raise InvalidRequest(f"{found[0]} cannot be combined with tools", param=found[0])


def plan(
    request: TurnRequest,
    choice: Literal["auto", "required"] | NamedToolChoice,
    compiled: dict[str, CompiledSchema],
    *,
    decides: bool = False,
    answer: CompiledSchema | None = None,
) -> ToolPlan:
    req = request.chat
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
    if request.system_rule is not None:
        messages = with_system_rule(messages, request.system_rule)
    # the decision before the call (loopstack.serving.constraint.decision): auto turns of a backend
    # whose grammar writes it
    decide = req.loopstack.decide and mode == "auto" and decides
    if decide:
        messages = with_system_rule(messages, DECIDE_RULE)
    if answer is not None:  # auto turns only (`admit`): the model is told its answer's shape
        messages = with_system_rule(messages, answer_rule(answer.schema))
    if request.closing_rule is not None:  # after the conversation: the prefix stays the same
        messages = [*messages, {"role": "system", "content": request.closing_rule}]
    prompt = request.prompts.render(messages, tools)
    max_tokens = req.completion_limit or request.max_tool_tokens
    context = getattr(request.prompts, "max_model_len", None)
    if not isinstance(context, int):
        prompt_tokens = request.prompts.check_fits(prompt, max_tokens)
    else:  # the prompt counted once (a harness's is ~19k tokens)
        prompt_tokens = request.prompts.check_fits(prompt, 0)  # too long alone: the 400
        added = (
            request.system_rule is not None
            or request.closing_rule is not None
            or decide
            or answer is not None
        )
        if added and prompt_tokens < context:
            # the rules added here were not in the prompt the completion limit was fitted to
            # (loopstack.serving.http.context_fit): they take their room from the completion
            max_tokens = min(max_tokens, context - prompt_tokens)
        if prompt_tokens + max_tokens > context:
            request.prompts.check_fits(prompt, max_tokens)  # the 400, in its words
    sampling = {k: getattr(req, k) for k in _SAMPLING_KEYS if getattr(req, k) is not None}
    extra = {k: v for k, v in (req.model_extra or {}).items() if k not in _CHAT_ONLY}
    return ToolPlan(
        mode=mode,
        tools=offered,
        model=request.engine_model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        sampling={**extra, **sampling},
        parallel=req.parallel_tool_calls,
        stream=req.stream,
        answered=answered,
        decide=decide,
        answer=answer,
    )


def answer_rule(schema: Any) -> str:
    """What the system message says of a ``response_format`` beside tools (the grammar
    holds the answer to it; the model is told its fields, as a hosted API tells its own)."""
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return (
        "Call the tools the request needs first, and take every fact from their results. "
        "Once you have what the answer needs, answer with one JSON value, with no text around "
        f"it, that follows this JSON schema: {text}"
    )


async def answer_schema(backend: Backend, req: ChatCompletionRequest) -> CompiledSchema | None:
    """The schema an ``auto`` turn's answer is held to: ``response_format``'s ``json_schema``
    (admitted like a tool's parameters), any object for ``json_object``; None for text."""
    rf = req.response_format
    found = client_constraint({"response_format": rf.model_dump(by_alias=True)}) if rf else None
    if found is None:  # text
        return None
    param, kind, value = found  # the one reading of response_format (client_constraints)
    schema = {"type": "object"} if kind == "json_object" else value
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} needs `schema`", param=param)
    return await backend.tool_schema(schema, what=param, enforced=req.loopstack.constrained)


def with_system_rule(messages: list[dict[str, Any]], rule: str) -> list[dict[str, Any]]:
    """`messages` with `rule` at the end of the system message (one is added)."""
    if messages and messages[0].get("role") in ("system", "developer"):
        first = dict(messages[0])
        text = first.get("content")
        if isinstance(text, list):  # content parts: the rule as one more part
            first["content"] = [*text, {"type": "text", "text": "\n\n" + rule}]
        else:
            first["content"] = f"{text or ''}\n\n{rule}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": rule}, *messages]


# -- the baseline ---------------------------------------------------------------------------
class Baseline:
    """``loopstack.constrained: false``: the configured backend's admission (validated,
    never enforced), no constraint, calls read leniently from the text."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def resolve(self, request: TurnRequest, transport: Transport) -> AsyncIterator[Event]:
        admitted = await admit(self.backend, request)
        for header in admitted.headers:
            yield header
        if admitted.plan is None:
            async for ev in pass_through(self.backend, request, transport):
                yield ev
            return
        yield Ready(admitted.plan.mode, admitted.plan.prompt_tokens)
        async for turn_ev in baseline_turn(admitted.plan, transport):
            yield turn_ev


class Resolver:
    """Which backend resolves a request: the configured one (`backend`), or the baseline
    when the request asks for no constraint."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.baseline = Baseline(backend)

    def resolve(self, request: TurnRequest, transport: Transport) -> AsyncIterator[Event]:
        if request.constrained:
            return self.backend.resolve(request, transport)
        return self.baseline.resolve(request, transport)

    async def completion(
        self, body: dict[str, Any], transport: Transport
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        return await pass_completion(self.backend, body, transport)


# -- passed through ---------------------------------------------------------------------------
async def pass_through(
    backend: Backend, request: TurnRequest, transport: Transport
) -> AsyncIterator[Event]:
    """A chat request the engine answers as it is: its client constraint admitted by
    `backend` (or refused) - unconstrained (the baseline): none is sent; a whole answer
    failing its ``response_format`` schema is generated again."""
    req = request.chat
    body = req.model_dump(exclude={"loopstack"}, exclude_none=True, by_alias=True)
    body["model"] = request.engine_model
    admitted = await admit_constraints(body, backend, constrained=req.loopstack.constrained)
    body, schema = admitted.body, admitted.schema
    if req.stream:
        chunks = await relay(transport, CHAT_PATH, body)
        assert not isinstance(chunks, dict)
        yield Relay(chunks)
        return
    temperature = float(body.get("temperature") or 0.0)

    async def attempt(n: int) -> AsyncIterator[Whole | Retry]:
        resp = await collect(transport, CHAT_PATH, {**body, **REGENERATE.sampling(n, temperature)})
        resp["model"] = req.model
        if schema is None or not req.loopstack.constrained:
            yield Whole(resp)
        elif not (bad := await _invalid_json_choices(resp, schema)):
            yield Whole(resp)
        else:
            logger.warning("response_format output failed its schema (attempt %d)", n + 1)
            yield Retry(n, [f"choice {i} fails the schema" for i in bad])

    async for ev in regenerating("output", attempt):
        if isinstance(ev, Whole):  # a regenerated reply is not a tool-call retry
            yield ev


async def pass_completion(
    backend: Backend, body: dict[str, Any], transport: Transport
) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    """A /v1/completions body, its client constraint admitted (or InvalidRequest), relayed."""
    send = (await admit_constraints(body, backend)).body
    return await relay(transport, "/v1/completions", send)


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
