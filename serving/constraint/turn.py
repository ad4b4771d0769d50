"""One model turn: what the chat service hands a constraint backend, what comes back, and
the pieces every backend's turn is made of.

* `ToolPlan` - what one tool request resolved to (mode, admitted tool schemas, the rendered
  prompt, sampling, the calls already answered for ``loopstack.no_repeat``); the backend's
  `admit` adds its own constraint.
* `Event` - what a turn yields: content text, tool-call deltas, `Retry` (a turn generated
  again), `AutoSwitch` (outlines: free text turned into a constrained call), then `Done`.
  The chat service assembles the reply from them and counts the metrics from them.
* `REGENERATE` - the one regenerate-on-invalid policy: a turn (or a ``response_format``
  reply) whose output fails its schema is generated again, sampling anew, up to
  `MAX_ATTEMPTS` in all; then 502.
* `generate` - the text of one streamed engine completion, keeping the token count.
* With a grammar backend the whole turn - optional text, then one or more calls - is one
  vLLM request under one constraint (`grammar_turn`). `TurnParser` reads its text as it
  streams: content up to where a call starts (held back while the text could still become a
  call's start), then each call's name and argument text as it grows. A call starts only
  where the text names an offered tool (`envelope.call_start_regex`), which is exactly where
  the constraint's triggers start enforcing. Calls whose schemas the backend enforces
  exactly stream as generated (and are still checked, for the logs and metrics); the others
  are validated with jsonschema first, and a failing turn is generated again.
* `baseline_turn` - no constraint at all (``loopstack.constrained: false``, the benchmarks'
  baseline): calls read leniently from the text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import regex

from serving import envelope
from serving.constraint.schemas import CompiledSchema
from serving.engine import Engine, sse_json
from serving.exceptions import ToolCallValidationError
from serving.toolcalls import CallEvent, JsonScan, ParsedCall, new_call_id, parse_lenient

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


@dataclass
class Tally:
    """Running totals over every engine request that makes up one reply."""

    tokens: int = 0
    finish: str = "stop"
    cached: int | None = None  # cached prompt tokens of the first engine request


@dataclass
class ContentDelta:
    text: str


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


Event = ContentDelta | CallEvent | Retry | AutoSwitch | Done


@dataclass
class ToolPlan:
    """What one tool request resolved to; `constraint` is the backend's, from its `admit`."""

    mode: ToolMode
    tools: dict[str, CompiledSchema]
    constrained: bool
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
    constraint: Any = None

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.tools.values())

    @property
    def temperature(self) -> float:
        return float(self.sampling.get("temperature") or 0.0)

    def body(self, engine: Engine, prompt: str, tally: Tally, **extra: Any) -> dict[str, Any]:
        """A streamed /v1/completions request for `prompt`, within the turn's token budget."""
        return {
            **self.sampling,
            "model": engine.model_name,
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


async def generate(engine: Engine, body: dict[str, Any], tally: Tally) -> AsyncGenerator[str]:
    """Text deltas of one streamed completion; keeps the token count and finish reason.
    Leaving the loop early closes the stream, which makes vLLM abort the request."""
    chunks, counted = 0, False
    events = sse_json(engine.stream("/v1/completions", body))
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


class TurnParser:
    """Incremental reader of one turn's text: content, then calls of the offered tools."""

    def __init__(self, names: list[str], *, max_calls: int, text: bool = True) -> None:
        self._start = regex.compile(envelope.call_start_regex(names))
        self.text = ""
        self.calls: list[ParsedCall] = []
        self.max_calls = max_calls
        self._text = text  # False (required/named): everything is envelope, nothing content
        self._pos = 0  # scanning resumes here
        self._sent = 0  # content emitted up to here
        self._reading: ParsedCall | None = None
        self._value, self._begun, self._scalar = JsonScan(), False, False
        self.starting = False  # the text ends in what may become a call's start

    def feed(self, delta: str) -> list[ContentDelta | CallEvent]:
        self.text += delta
        events: list[ContentDelta | CallEvent] = []
        while len(self.calls) < self.max_calls or self._reading is not None:
            if self._reading is not None:
                start, end = self._pos, self._scan()
                piece = self.text[start:end]
                if not self._reading.arguments:
                    piece = piece.lstrip()
                if piece:
                    self._reading.arguments += piece
                    events.append(CallEvent(self._reading.index, self._reading.id,
                                            arguments_delta=piece))  # fmt: skip
                if not self._reading.complete:
                    return events
                self._reading = None
                continue
            m = self._start.search(self.text, self._pos, partial=True)
            self.starting = m is not None and m.partial and m.end() > m.start()
            if m is None or m.partial:
                hold = len(self.text) if m is None else m.start()
                self._content(hold, events)
                self._pos = hold
                return events
            self._content(m.start(), events)
            call = ParsedCall(len(self.calls), new_call_id(), json.loads(m.group("name")))
            self.calls.append(call)
            events.append(CallEvent(call.index, call.id, name=call.name))
            self._reading, self._pos = call, m.end()
            self._value, self._begun, self._scalar = JsonScan(), False, False
        return events

    def finish(self) -> list[ContentDelta | CallEvent]:
        """At the end of the text: whatever content was held back as a possible call start."""
        events: list[ContentDelta | CallEvent] = []
        self._content(len(self.text), events)
        return events

    def _content(self, upto: int, events: list[ContentDelta | CallEvent]) -> None:
        if self._text and not self.calls and upto > self._sent:  # after a call: envelope
            events.append(ContentDelta(self.text[self._sent : upto]))
        self._sent = max(self._sent, upto)

    def _scan(self) -> int:
        """Advance through the arguments value; marks the call complete at its end."""
        i, buf = self._pos, self.text
        while i < len(buf):
            c = buf[i]
            i += 1
            if not self._begun:
                if c.isspace():
                    continue
                self._begun, self._scalar = True, c not in "{["
            if self._scalar and not self._value.in_string and c in ",}\n":
                i -= 1  # a scalar (not what a schema allows, but read it) ends before this
                self._finish_call()
                break
            if self._value.feed(c):
                self._finish_call()
                break
        self._pos = i
        return i

    def _finish_call(self) -> None:
        assert self._reading is not None
        self._reading.complete = True


async def grammar_turn(
    plan: ToolPlan, engine: Engine, constraint: dict[str, Any], *, live: bool
) -> AsyncIterator[Event]:
    """The turn as events, from one engine request under `constraint` (the request's
    ``structured_outputs``; more requests only to replace an invalid turn, `REGENERATE`)."""
    live = live and plan.exact
    auto = plan.mode == "auto"
    tally = Tally()
    prompt = plan.prompt + ("" if auto else envelope.TOOL_CALL_OPEN)
    first = plan.body(engine, prompt, tally, structured_outputs=constraint)
    spent = 0
    for attempt in range(REGENERATE.attempts):
        tally.tokens, tally.finish = 0, "stop"
        parser = TurnParser(list(plan.tools), max_calls=16 if plan.parallel else 1, text=auto)
        held: list[CallEvent] = []
        # what the engine wrote, kept only for the debug line of a turn cut at max_tokens
        raw: list[str] | None = [] if logger.isEnabledFor(logging.DEBUG) else None
        body = {**first, **REGENERATE.sampling(attempt, plan.temperature)}
        async for delta in generate(engine, body, tally):
            if raw is not None:
                raw.append(delta)
            for ev in parser.feed(delta):
                if isinstance(ev, ContentDelta):
                    if attempt == 0:  # text before a call is never regenerated for
                        yield ev
                elif live:
                    yield ev
                else:
                    held.append(ev)
        for ev in parser.finish():
            if attempt == 0:
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
        logger.warning("tool call failed validation (attempt %d): %s", attempt + 1, bad)
        yield Retry(attempt, bad)
    raise REGENERATE.exhausted("tool-call arguments")


async def baseline_turn(plan: ToolPlan, engine: Engine) -> AsyncIterator[Event]:
    """The benchmarks' baseline (``loopstack.constrained: false``): no constraint at all,
    calls read leniently from whatever the model wrote, never validated nor counted."""
    tally = Tally()
    prefix = "" if plan.mode == "auto" else envelope.TOOL_CALL_OPEN
    body = plan.body(engine, plan.prompt + prefix, tally)
    text = prefix + "".join([d async for d in generate(engine, body, tally)])
    found = parse_lenient(text)
    if not found:
        yield ContentDelta(text)
    for i, (name, args) in enumerate(found):
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        yield CallEvent(i, new_call_id(), name=name, arguments_delta=raw)
    yield Done("tool_calls" if found else tally.finish, tally.tokens, tally.cached)
