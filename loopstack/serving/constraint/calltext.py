"""Reading tool calls out of generated text: one incremental reader, and a lenient one.

* `CallReader` - **the** reader of call text as it streams: content up to where a call
  starts (held back while the text could still become a call's start), then each call's
  name as soon as it is known and its argument text as it grows, so streaming clients get
  real deltas. What counts as a call's start is its one parameter, a regex:

  - `CallReader.tools(names)` - a turn under a grammar backend: a call starts only where
    the text names an offered tool (`envelope.call_start_regex`), which is exactly where
    the grammar's triggers start enforcing;
  - `CallReader.calls_of_any_name()` - constrained call text (the outlines stages: ``{"name": ...,
    "arguments": ...}`` objects between ``</tool_call>`` tags), calls of any name;
  - `CallReader.intent()` - free text under ``tool_choice="auto"`` on the outlines path:
    content until a call's start (``<tool_call>``, a fenced or bare ``{"name": ...``
    object, bare only at the start of the reply or of a line); then `found` says where,
    and reading stops (the call is generated again, constrained).

* `parse_lenient` - for unconstrained output (the benchmark's baseline): ``<tool_call>`` tags,
  Markdown ```json fences or a bare JSON object, whatever the model wrote.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

import regex

from loopstack.serving.constraint import envelope

_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


@dataclass
class ParsedCall:
    index: int
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ContentDelta:
    text: str


@dataclass
class CallEvent:
    """What changed: a new call (`name` set) and/or more argument text."""

    index: int
    id: str
    name: str | None = None
    arguments_delta: str = ""


class JsonScan:
    """Where a JSON container streaming in ends: tracks strings, escapes and nesting."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False

    def feed(self, c: str) -> bool:
        """One character; True when it closes the outermost container."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


# Where a call starts in free text on the outlines path (``auto``): a tag, a fenced or a bare
# ``{"name":`` (bare only at the start of the reply or of a line, so an inline example does
# not count). Whitespace inside a marker is bounded: an undecided candidate is never more
# than ~230 characters back, so the reader never rescans more than that.
INTENT_START = (
    r'<tool_call>|```(?:json)?[ \t]{0,16}\n?\s{0,64}\{\s{0,64}"name"\s{0,64}:'
    r'|(?:(?<=\A\s*)|(?<=\n))\{\s{0,64}"name"\s{0,64}:'
)
# A call of any name in constrained call text (group ``name``: its JSON string).
ANY_CALL_START = r'\{\s*"name"\s*:\s*(?P<name>"(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*'
MAX_CALLS = 16


class CallReader:
    """Incremental reader of generated text: content, then calls (module docstring).

    `start` is the regex of a call's start; with a ``name`` group (the tool's name as a JSON
    string) the call is read, without one the reader stops there (`found`)."""

    def __init__(self, start: str, *, max_calls: int = MAX_CALLS, text: bool = True) -> None:
        self._start = regex.compile(start)
        self._named = "name" in self._start.groupindex
        self.text = ""
        self.calls: list[ParsedCall] = []
        self.max_calls = max_calls
        self.found: int | None = None  # `intent`: where a call starts in `text`
        self._text = text  # False: everything is envelope, nothing content
        self._pos = 0  # scanning resumes here
        self._sent = 0  # content emitted up to here
        self._reading: ParsedCall | None = None
        self._value, self._begun, self._scalar = JsonScan(), False, False
        self.starting = False  # the text ends in what may become a call's start

    @classmethod
    def tools(cls, names: list[str], *, max_calls: int, text: bool = True) -> CallReader:
        return cls(envelope.call_start_regex(names), max_calls=max_calls, text=text)

    @classmethod
    def calls_of_any_name(cls, *, max_calls: int = MAX_CALLS) -> CallReader:
        return cls(ANY_CALL_START, max_calls=max_calls, text=False)

    @classmethod
    def intent(cls) -> CallReader:
        return cls(INTENT_START, max_calls=1)

    def feed(self, delta: str) -> list[ContentDelta | CallEvent]:
        self.text += delta
        events: list[ContentDelta | CallEvent] = []
        while self.found is None and (
            len(self.calls) < self.max_calls or self._reading is not None
        ):
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
            if not self._named:  # a call starts here: the reader's job is done
                self.found = self._pos = m.start()
                return events
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

    @property
    def sent(self) -> int:
        """How much of `text` went out as content (never taken back)."""
        return self._sent

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


# --------------------------------------------------------------------------- lenient parsing
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*(?:```|$)", re.S)


def parse_lenient(text: str) -> list[tuple[str, Any]]:
    """Best-effort (name, arguments) pairs from free text. Arguments may be any JSON or str."""
    blobs = _TAGGED.findall(text) or _FENCED.findall(text) or [text.strip()]
    calls: list[tuple[str, Any]] = []
    for blob in blobs:
        obj = _loads_first_object(blob)
        if isinstance(obj, list):
            items = obj
        else:
            items = [obj]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                args = item.get("arguments", item.get("parameters", {}))
                calls.append((item["name"], args))
    return calls


def _loads_first_object(blob: str) -> Any:
    start = min((i for i in (blob.find("{"), blob.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(blob[start:])
    except json.JSONDecodeError:
        return None
    return obj
