"""One model turn: what a backend's `resolve` yields, and the pieces every turn is made of.

* `ToolPlan` - what one tool request resolved to (mode, admitted tool schemas, the rendered
  prompt, sampling, the calls already answered for ``loopstack.no_repeat``): an immutable
  value; a backend's constraint for it is its own return value, never written into it.
* `Event` - what `resolve` yields: `Header` (a response header), `Ready` (admitted: a tool
  turn starts), content text, tool-call deltas, `Retry` (a turn generated again),
  `AutoSwitch` (outlines: free text turned into a constrained call), then `Done`; or, for a
  request passed through to the engine, `Whole` (its answer) or `Relay` (its stream's chunks).
  The chat front-end assembles the reply from them and counts the metrics from them.
* `REGENERATE` and `regenerating` - the one regenerate-on-invalid policy and the one loop
  that applies it: a turn (or a ``response_format`` reply) whose output fails its schema is
  generated again, sampling anew, up to `MAX_ATTEMPTS` in all; then 502.
* `generate` - the text of one streamed engine completion, keeping the token count.
* With a grammar backend the whole turn - optional text, then one or more calls - is one
  vLLM request under one constraint (`grammar_turn`), its text read as it streams by the
  one call-text reader (`calltext.CallReader.tools`): content, then each call's name and
  argument text as it grows, a call starting only where the text names an offered tool.
  Calls whose schemas the backend enforces exactly stream as generated (and are still
  checked, for the logs and metrics); the others are validated with jsonschema first, and a
  failing turn is generated again.
* `baseline_turn` - no constraint at all (``loopstack.constrained: false``, the benchmarks'
  baseline): calls read leniently from the text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from loopstack.serving.constraint import envelope
from loopstack.serving.constraint.calltext import (
    CallEvent,
    CallReader,
    ContentDelta,
    ParsedCall,
    new_call_id,
    parse_lenient,
)
from loopstack.serving.constraint.schemas import CompiledSchema
from loopstack.serving.engine.transport import Transport, sse_json
from loopstack.serving.exceptions import ToolCallValidationError

logger = logging.getLogger(__name__)

ToolMode = Literal["required", "named", "auto"]
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Regeneration:
    """The one regenerate-on-invalid policy. Attempt 0 is the request as the client asked;
    each later one samples anew: temperature at least `min_temperature`, seed = the
    attempt's number (so no two attempts share one)."""

    attempts: int = MAX_ATTEMPTS
    min_temperature: float = 0.7

    def sampling(self, attempt: int, temperature: float) -> dict[str, Any]:
        """What attempt `attempt` changes in the engine request (nothing for the first)."""
        if attempt == 0:
            return {}
        return {"temperature": max(temperature, self.min_temperature), "seed": attempt}

    def exhausted(self, what: str) -> ToolCallValidationError:
        return ToolCallValidationError(f"the model did not produce {what} valid for the schema")


REGENERATE = Regeneration()
E = TypeVar("E")


async def regenerating(what: str, attempt: Callable[[int], AsyncIterator[E]]) -> AsyncIterator[E]:
    """The one regenerate-on-invalid loop: `attempt(n)`'s events, attempt after attempt,
    until one ends without a `Retry` (its last event when its output failed); after
    `REGENERATE.attempts` failures, 502 (`ToolCallValidationError`)."""
    for n in range(REGENERATE.attempts):
        failed = False
        async for ev in attempt(n):
            failed = isinstance(ev, Retry)
            yield ev
        if not failed:
            return
    raise REGENERATE.exhausted(what)


@dataclass
class Tally:
    """Running totals over every engine request that makes up one reply."""

    tokens: int = 0
    finish: str = "stop"
    cached: int | None = None  # cached prompt tokens of the first engine request


@dataclass(frozen=True)
class Header:
    """A response header the reply carries (e.g. ``x-loopstack-schema-repaired``)."""

    name: str
    value: str


@dataclass(frozen=True)
class Ready:
    """The tool request is admitted (nothing is refused with a 400 after this): its turn
    starts. ``loopstack_tool_requests`` counts it."""

    mode: ToolMode
    prompt_tokens: int


@dataclass(frozen=True)
class Whole:
    """A request passed through to the engine: its whole answer (the client's model name)."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Relay:
    """A request passed through to the engine: its answer's stream, as the engine's chunk
    objects (read by the transport's one SSE reader, `sse_json`)."""

    chunks: AsyncIterator[dict[str, Any]]


@dataclass
class Retry:
    """The turn failed validation and is generated again (``loopstack_tool_call_retries``)."""

    attempt: int  # the attempt that failed (0: the first)
    problems: list[str]


@dataclass
class AutoSwitch:
    """``auto`` on the outlines backend: the free text turned into a constrained call."""


@dataclass
class Done:
    finish_reason: str
    completion_tokens: int
    cached_tokens: int | None = None  # the engine's prompt_tokens_details.cached_tokens
    calls: int = 0  # whole calls returned, checked against their schemas
    invalid: int = 0  # of those, calls that failed the check after they streamed out
    checked: bool = True  # False: the unconstrained baseline (its calls are not counted)


TurnEvent = ContentDelta | CallEvent | Retry | AutoSwitch | Done
Event = Header | Ready | Whole | Relay | TurnEvent


@dataclass(frozen=True)
class ToolPlan:
    """What one tool request resolved to (immutable: a backend's constraint for it is the
    return value of its `admit`, passed to the turn beside it)."""

    mode: ToolMode
    tools: dict[str, CompiledSchema]
    model: str  # the engine's name for the model
    prompt: str
    prompt_tokens: int
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    parallel: bool = True
    stream: bool = False  # the reply streams: calls a backend enforces exactly go out live
    # ``loopstack.no_repeat``: tool name -> argument objects already called and answered
    answered: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # ``loopstack.decide`` (auto): the grammar starts with a decision line, hidden from the reply
    decide: bool = False
    # auto: the client's ``response_format`` schema (``json_object``: any object), which an
    # answer without a call is held to (the Agents SDK's ``output_type`` beside its tools)
    answer: CompiledSchema | None = None

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.tools.values())

    @property
    def temperature(self) -> float:
        return float(self.sampling.get("temperature") or 0.0)

    def body(self, prompt: str, tally: Tally, **extra: Any) -> dict[str, Any]:
        """A streamed /v1/completions request for `prompt`, within the turn's token budget."""
        return {
            **self.sampling,
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_tokens - tally.tokens,
            "skip_special_tokens": False,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }

    async def problems(self, call: ParsedCall) -> list[str]:
        """Why `call` is not a valid call of an offered tool (empty: it is)."""
        schema = self.tools.get(call.name)
        if schema is None:
            return [f"unknown tool {call.name!r}"]
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError as exc:
            return [f"arguments are not JSON: {exc}"]
        return await schema.errors_off_loop(args)


async def generate(transport: Transport, body: dict[str, Any], tally: Tally) -> AsyncGenerator[str]:
    """Text deltas of one streamed completion; keeps the token count and finish reason.
    Leaving the loop early closes the stream, which makes vLLM abort the request."""
    chunks, counted = 0, False
    events = sse_json(transport.send("/v1/completions", body))
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


async def grammar_turn(
    plan: ToolPlan, transport: Transport, constraint: dict[str, Any], *, live: bool
) -> AsyncIterator[TurnEvent]:
    """The turn as events, from one engine request under `constraint` (the request's
    ``structured_outputs``; more requests only to replace an invalid turn, `regenerating`)."""
    live = live and plan.exact
    auto = plan.mode == "auto"
    tally = Tally()
    prompt = plan.prompt + ("" if auto else envelope.TOOL_CALL_OPEN)
    first = plan.body(prompt, tally, structured_outputs=constraint)
    spent = 0

    async def attempt(n: int) -> AsyncIterator[TurnEvent]:
        nonlocal spent
        tally.tokens, tally.finish = 0, "stop"
        parser = CallReader.tools(list(plan.tools), max_calls=16 if plan.parallel else 1, text=auto)
        held: list[CallEvent] = []
        # what the engine wrote, kept only for the debug line of a turn cut at max_tokens
        raw: list[str] | None = [] if logger.isEnabledFor(logging.DEBUG) else None
        body = {**first, **REGENERATE.sampling(n, plan.temperature)}
        async for delta in generate(transport, body, tally):
            if raw is not None:
                raw.append(delta)
            for ev in parser.feed(delta):
                if isinstance(ev, ContentDelta):
                    if n == 0:  # text before a call is never regenerated for
                        yield ev
                elif live:
                    yield ev
                else:
                    held.append(ev)
        for ev in parser.finish():
            if n == 0:
                yield ev
        spent += tally.tokens
        if raw is not None and tally.finish == "length":
            logger.debug("turn cut at max_tokens; the engine wrote %r", "".join(raw)[-1500:])
        calls = [c for c in parser.calls if c.complete]
        found = [(c, await plan.problems(c)) for c in calls]
        bad = [f"{c.name}: {p}" for c, ps in found for p in ps]
        if not calls and not auto and tally.finish == "stop":
            bad.append(f"no complete call in {parser.text!r:.200}")
        if live or not bad:
            if live and bad:
                logger.error("invalid tool call left the server: %s", bad)
            done = {c.index for c in calls}
            for ev in held:
                if ev.index in done:
                    yield ev
            # max_tokens ran out after the last whole call (before the end-of-turn token, or
            # after its closing tag), no other call begun: a tool-calls turn
            cut = tally.finish == "length" and (len(calls) < len(parser.calls) or parser.starting)
            finish = "tool_calls" if calls and not cut else tally.finish
            invalid = sum(1 for _, ps in found if ps) if live else 0
            yield Done(finish, spent, tally.cached, calls=len(calls), invalid=invalid)
            return
        logger.warning("tool call failed validation (attempt %d): %s", n + 1, bad)
        yield Retry(n, bad)

    async for ev in regenerating("tool-call arguments", attempt):
        yield ev


async def baseline_turn(plan: ToolPlan, transport: Transport) -> AsyncIterator[TurnEvent]:
    """The benchmarks' baseline (``loopstack.constrained: false``): no constraint at all,
    calls read leniently from whatever the model wrote, never validated nor counted."""
    tally = Tally()
    prefix = "" if plan.mode == "auto" else envelope.TOOL_CALL_OPEN
    body = plan.body(plan.prompt + prefix, tally)
    text = prefix + "".join([d async for d in generate(transport, body, tally)])
    found = parse_lenient(text)
    if not found:
        yield ContentDelta(text)
    for i, (name, args) in enumerate(found):
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        yield CallEvent(i, new_call_id(), name=name, arguments_delta=raw)
    finish = "tool_calls" if found else tally.finish
    yield Done(finish, tally.tokens, tally.cached, checked=False)
