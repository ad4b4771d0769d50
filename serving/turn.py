"""One engine request per model turn: reading a turn back, and regenerating a bad one.

With a grammar backend (`serving.constraint_backend`) the whole turn - optional text, then
one or more calls - is one vLLM request under one constraint. `TurnParser` reads its text
as it streams: content up to where a call starts (held back while the text could still
become a call's start), then each call's name and argument text as it grows. A call starts
only where the text names an offered tool (`envelope.call_start_regex`), which is exactly
where the constraint's triggers start enforcing.

`turn_events` runs the request. Calls whose schemas the backend enforces exactly stream as
generated (and are still checked, for the logs and metrics); the others are validated with
jsonschema first, and a failing turn is generated again, then refused (502).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import regex

from serving import envelope
from serving.constraint import CompiledSchema
from serving.constraint_backend import ToolMode
from serving.exceptions import ToolCallValidationError
from serving.toolcalls import CallEvent, JsonScan, ParsedCall, new_call_id

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3


@dataclass
class ToolPlan:
    """What one tool request resolved to."""

    mode: ToolMode
    tools: dict[str, CompiledSchema]
    constrained: bool
    prompt: str
    prompt_tokens: int
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    parallel: bool = True
    constraint: dict[str, Any] | None = None  # one request per turn (a grammar backend)
    regexes: Any = None  # the outlines path's (`serving.backend_outlines.Regexes`)

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.tools.values())


@dataclass
class Tally:
    """Running totals over every engine request that makes up one reply."""

    tokens: int = 0
    finish: str = "stop"
    calls: int = 0
    invalid: int = 0
    retries: int = 0
    cached: int | None = None  # cached prompt tokens of the first engine request


@dataclass
class ContentDelta:
    text: str


@dataclass
class Done:
    finish_reason: str
    completion_tokens: int
    cached_tokens: int | None = None  # the engine's prompt_tokens_details.cached_tokens


Event = ContentDelta | CallEvent | Done


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


@dataclass
class TurnRequest:
    """What `turn_events` needs from the chat service for one turn."""

    names: list[str]
    auto: bool
    parallel: bool
    exact: bool
    body: dict[str, Any]  # the engine request (prompt, constraint, sampling)
    temperature: float


Stream = Callable[[dict[str, Any], Any], AsyncIterator[str]]
Problems = Callable[[ParsedCall], Awaitable[list[str]]]


async def turn_events(
    turn: TurnRequest, *, stream: Stream, problems: Problems, tally: Tally, live: bool
) -> AsyncIterator[Event]:
    """The turn as events, from one engine request (more only to replace an invalid turn).

    `tally` keeps the token count and finish reason."""
    live = live and turn.exact
    body = turn.body
    spent = 0
    for attempt in range(MAX_ATTEMPTS):
        tally.tokens, tally.finish = 0, "stop"
        parser = TurnParser(turn.names, max_calls=16 if turn.parallel else 1, text=turn.auto)
        held: list[CallEvent] = []
        # what the engine wrote, kept only for the debug line of a turn cut at max_tokens
        raw: list[str] | None = [] if logger.isEnabledFor(logging.DEBUG) else None
        async for delta in stream(body, tally):
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
        found = [(c, await problems(c)) for c in calls]
        bad = [f"{c.name}: {p}" for c, ps in found for p in ps]
        if not calls and not turn.auto and tally.finish == "stop":
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
            tally.invalid = sum(1 for _, ps in found if ps) if live else 0
            tally.calls = len(calls)
            yield Done(finish, spent, tally.cached)
            return
        logger.warning("tool call failed validation (attempt %d): %s", attempt + 1, bad)
        tally.retries += 1
        body = {**turn.body, "temperature": max(turn.temperature, 0.7), "seed": attempt + 1}
    raise ToolCallValidationError(
        "the model did not produce tool-call arguments valid for the schema"
    )
