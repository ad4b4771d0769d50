"""The strict checkers: did a client's run do its task? Pure functions over what the client
reported (its final answer, its output object, the files it left).

The grader's rules: a number counts only as itself (17 is not 170, 17.5, -17 or 1.7), a
statement under a negation in its own clause does not count ("it is not 17 °C", "I couldn't
create the file"), a second temperature that contradicts the tool's fails the answer, and the
tool must really have run (the value could not be known otherwise; a run that guessed it
right without the tool is still not a round trip)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A clause ends at a sentence mark followed by space or the end, a new line, "but"/"however",
# or a comma before "so", "and" or "then".
_CLAUSE_END = re.compile(r"[.!?;:](?=\s|$)|\n|\bbut\b|\bhowever\b|,\s*(?=(?:so|and|then)\b)", re.I)
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|nor|cannot|unable|without|failed|fails|fail|neither)\b|n't\b"
    r"|\bcan ?not\b",
    re.I,
)
# A number with a temperature unit after it: "17°C", "17 °C", "17 degrees", "17 C", "63°F".
_TEMPERATURE = re.compile(
    r"(?<![\w.-])(-?\d+(?:\.\d+)?)\s*(?:°|º|degrees?\b|deg\b)?\s*"
    r"(?:(c\b|celsius|centigrade)|(f\b|fahrenheit))",
    re.I,
)
_DONE_WORDS = re.compile(
    r"\b(?:done|created|added|wrote|written|saved|complete|completed|finished|made)\b", re.I
)


@dataclass(frozen=True)
class Verdict:
    """One run judged: ``done`` when the task was done; ``why`` says what decided it."""

    done: bool
    why: str


def _clause_start(text: str, pos: int) -> int:
    start = 0
    for m in _CLAUSE_END.finditer(text, 0, pos):
        start = m.end()
    return start


def negated(text: str, pos: int) -> bool:
    """A negation stands between the start of the clause holding ``pos`` and ``pos``."""
    return _NEGATION.search(text[_clause_start(text, pos) : pos]) is not None


def number_positions(text: str, value: int) -> list[int]:
    """Where ``value`` appears as a whole number of its own: not inside a longer number, not
    a decimal's part, not with a minus sign (``-17`` is another value)."""
    pattern = rf"(?<![\d.\-−]){value}(?!\d|[.,]\d)"
    return [m.start() for m in re.finditer(pattern, text)]


def states_number(text: str | None, value: int) -> Verdict:
    """The text states ``value`` (once at least, not negated) and no other Celsius
    temperature; a Fahrenheit figure must be ``value``'s conversion (±1)."""
    if not text or not text.strip():
        return Verdict(False, "no answer")
    stated = [p for p in number_positions(text, value) if not negated(text, p)]
    if not stated:
        if number_positions(text, value):
            return Verdict(False, f"{value} only under a negation")
        return Verdict(False, f"{value} not in the answer")
    fahrenheit = value * 9 / 5 + 32
    for m in _TEMPERATURE.finditer(text):
        number = float(m.group(1))
        if negated(text, m.start()):
            continue
        if m.group(2) and number != value:
            return Verdict(False, f"also states {m.group(0).strip()!r}")
        if m.group(3) and abs(number - fahrenheit) > 1:
            return Verdict(False, f"states {m.group(0).strip()!r}, not {value} °C's conversion")
    return Verdict(True, f"states {value}")


def says_done(text: str | None) -> bool:
    """A completion word ("created", "done", ...) not negated in its clause."""
    if not text:
        return False
    return any(not negated(text, m.start()) for m in _DONE_WORDS.finditer(text))


def _tool_ran(report: dict[str, Any]) -> list[Any]:
    ran = report.get("tool_ran")
    return ran if isinstance(ran, list) else []


def check_weather_answer(report: dict[str, Any], value: int) -> Verdict:
    """An SDK's tool round trip: the tool ran, the final answer states its value."""
    if report.get("error"):
        return Verdict(False, f"error: {str(report['error'])[:200]}")
    if not _tool_ran(report):
        return Verdict(False, "the tool never ran")
    if report.get("answer") is None and report.get("gave_up"):
        return Verdict(False, str(report["gave_up"]))
    return states_number(report.get("answer"), value)


def check_agents_output(report: dict[str, Any], value: int) -> Verdict:
    """The Agents SDK's ``output_type`` task: the final output validated as the model (the
    SDK returned an instance of it), the tool ran, its value exact in ``temperature_c`` and
    the city the one asked about."""
    if report.get("error"):
        return Verdict(False, f"error: {str(report['error'])[:200]}")
    if report.get("output_type") != "WeatherReport":
        return Verdict(False, f"final output is a {report.get('output_type')}, not a WeatherReport")
    out = report.get("output")
    if not isinstance(out, dict):
        return Verdict(False, "no final output")
    if not _tool_ran(report):
        return Verdict(False, "the tool never ran")
    temp = out.get("temperature_c")
    if isinstance(temp, bool) or not isinstance(temp, int) or temp != value:
        return Verdict(False, f"temperature_c {temp!r}, the tool said {value}")
    if "paris" not in str(out.get("city", "")).lower():
        return Verdict(False, f"city {out.get('city')!r}, not Paris")
    return Verdict(True, f"WeatherReport with temperature_c {value}")


def check_codex(
    events: list[dict[str, Any]], files: dict[str, str], name: str, content: str
) -> Verdict:
    """Codex's ``apply_patch`` task: the file exists with exactly the content asked (one
    trailing newline allowed), the turn completed, and the last message says it is done."""
    if name not in files:
        return Verdict(False, f"{name} not created")
    if files[name].removesuffix("\n") != content:
        return Verdict(False, f"{name} holds {files[name][:80]!r}, not {content!r}")
    if not any(e.get("type") == "turn.completed" for e in events):
        return Verdict(False, "the turn never completed")
    messages = [
        e["item"].get("text", "")
        for e in events
        if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"
    ]
    if not messages or not says_done(messages[-1]):
        last = messages[-1][:120] if messages else None
        return Verdict(False, f"file right, but the last message does not say done: {last!r}")
    return Verdict(True, f"{name} written and said done")


def check_claude(result: dict[str, Any], token: str) -> Verdict:
    """Claude Code's reading task: no error, and the answer holds the file's random token
    (exactly, not negated)."""
    if result.get("is_error") or result.get("type") != "result":
        return Verdict(False, f"error: {str(result.get('result') or result)[:200]}")
    text = str(result.get("result") or "")
    found = [m.start() for m in re.finditer(re.escape(token), text)]
    if not found:
        return Verdict(False, f"{token} not in the answer")
    if all(negated(text, p) for p in found):
        return Verdict(False, f"{token} only under a negation")
    return Verdict(True, f"answered {token}")
