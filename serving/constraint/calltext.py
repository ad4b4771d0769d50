"""Reading tool calls out of generated text.

* `CallStreamParser` - incremental, for constrained output (``{"name": ..., "arguments": ...}``
  objects separated by ``</tool_call>`` tags): yields a call's name as soon as it is known and
  its argument text as it grows, so streaming clients get real deltas.
* `parse_lenient` - for unconstrained output (the benchmark's baseline): ``<tool_call>`` tags,
  Markdown ```json fences or a bare JSON object, whatever the model wrote.
* `IntentDetector` - for ``tool_choice="auto"``: watches free text for the start of a call
  (``<tool_call>``, a fenced or bare ``{"name": ...`` object) and says how much text is safe
  to show the client before it can tell.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

import regex

from serving.constraint.envelope import ANY_HEAD

_ALPHABET = string.ascii_letters + string.digits
_HEAD = ANY_HEAD


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
class CallEvent:
    """What changed: a new call (`name` set) and/or more argument text."""

    index: int
    id: str
    name: str | None = None
    arguments_delta: str = ""


@dataclass
class CallStreamParser:
    """Incremental parser for constrained tool-call text."""

    calls: list[ParsedCall] = field(default_factory=list)
    _buf: str = ""
    _pos: int = 0  # where scanning resumes in _buf
    _value: JsonScan = field(default_factory=lambda: JsonScan())

    @property
    def text(self) -> str:
        return self._buf

    def feed(self, text: str) -> list[CallEvent]:
        self._buf += text
        events: list[CallEvent] = []
        while True:
            current = self.calls[-1] if self.calls and not self.calls[-1].complete else None
            if current is None:
                m = _HEAD.search(self._buf, self._pos)
                if m is None:
                    return events
                name = json.loads(f'"{m.group(1)}"')
                call = ParsedCall(len(self.calls), new_call_id(), name)
                self.calls.append(call)
                events.append(CallEvent(call.index, call.id, name=name))
                self._pos, self._value = m.end(), JsonScan()
                continue
            start = self._pos
            end = self._scan()
            delta = self._buf[start:end]
            if delta:
                current.arguments += delta
                events.append(CallEvent(current.index, current.id, arguments_delta=delta))
            if not current.complete:
                return events

    def _scan(self) -> int:
        """Advance through the arguments value; marks the call complete at its end."""
        i, buf = self._pos, self._buf
        while i < len(buf):
            i += 1
            if self._value.feed(buf[i - 1]):
                self.calls[-1].complete = True
                break
        self._pos = i
        return i


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


# --------------------------------------------------------------------------- auto mode
# Whitespace inside a marker is bounded, so a match spans at most ~230 characters: a
# candidate left undecided by the text so far is never more than that far back.
_INTENT = regex.compile(
    r'<tool_call>|```(?:json)?[ \t]{0,16}\n?\s{0,64}\{\s{0,64}"name"\s{0,64}:'
    r'|\{\s{0,64}"name"\s{0,64}:'
)
_MARK_START = regex.compile(r"[<`{]")


@dataclass
class Intent:
    """Found a call: `text_before` is what the model wrote before it (shown as content)."""

    text_before: str


class IntentDetector:
    """Decides, as text streams in, whether the model has started a tool call.

    Incremental: each candidate marker (``<``, a backtick, ``{``) is tried once it appears,
    and again only while the text so far is a prefix of a marker; everything before the
    earliest undecided candidate is settled and never scanned again. (Rescanning the whole
    text on every chunk took 14 s over 32k characters of call-like text.)
    """

    def __init__(self) -> None:
        self.text = ""
        self._pos = 0  # no call can start before this
        self._first_ink: int | None = None  # first non-whitespace character

    def feed(self, delta: str) -> tuple[int, Intent | None]:
        """Returns (how many chars of self.text are safe to emit, intent if one started)."""
        start = len(self.text)
        self.text += delta
        text = self.text
        if self._first_ink is None:
            ink = next((i for i in range(start, len(text)) if not text[i].isspace()), None)
            self._first_ink = ink
        hold: int | None = None
        # Not just the first marker: an inline {"name": ...} example must not hide a later call.
        for mark in _MARK_START.finditer(text, self._pos):
            p = mark.start()
            if mark.group() == "{" and not self._bare_ok(p):
                continue
            m = _INTENT.match(text, p, partial=True)
            if m is None:
                continue
            if not m.partial:
                return p, Intent(text[:p].rstrip())
            if hold is None:
                hold = p  # could still grow into a marker: hold back from here
        self._pos = hold if hold is not None else len(text)
        return self._pos, None

    def _bare_ok(self, pos: int) -> bool:
        """A bare ``{"name"`` counts only at the start of the reply or of a line."""
        return self._first_ink is None or pos <= self._first_ink or self.text[pos - 1] == "\n"
