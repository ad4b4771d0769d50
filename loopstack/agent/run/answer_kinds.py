"""Typed final answers and self-consistency, two ways to ask for the final answer that are
off by default and measured on the golden set (docs/benchmarks.md says what they did).

* **Typed** (``LOOPSTACK_AGENT_ANSWER_TYPED=1``, like PydanticAI's or the Agents SDK's
  ``output_type``): the answer schema's ``value`` gets a type chosen from the question - a
  number for "how many / how much / what is 17.5% of ...", a boolean for a yes/no question,
  one of the named options for "A or B?" - and the model fills it before writing its
  sentence. The text shown leads with the value unless the sentence already states it.
* **Self-consistency** (``LOOPSTACK_AGENT_ANSWER_SAMPLES=n``): one request with ``n`` samples
  (temperature 0.7); the answer whose value (or normalised text) most samples agree on wins.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Kind", "final_answer_format", "kind_of", "render", "response_format", "vote"]

Kind = Literal["number", "yes_no", "choice", "text"]

_YES_NO = re.compile(
    r"^\s*(?:do|does|did|is|are|was|were|should|shall|can|could|will|would|has|have|had)\b", re.I
)
_NUMBER = re.compile(
    r"\b(?:how (?:many|much)|compute|calculate|convert|total|revenue|price|cost|rate|"
    r"percent|sum|average|number)\b|\bwhat is [\d(]|\d\s?%",
    re.I,
)
_CHOICE = re.compile(r"\b([A-Z][\w-]*(?:\s[A-Z][\w-]*)?)\s+or\s+([A-Z][\w-]*(?:\s[A-Z][\w-]*)?)")


@dataclass(frozen=True, slots=True)
class AnswerKind:
    kind: Kind
    choices: tuple[str, ...] = ()


def kind_of(question: str) -> AnswerKind:
    """The answer's type, read from the question (text when nothing fits)."""
    m = _CHOICE.search(question)
    if m and re.match(r"^\s*(?:which|who|what|where)\b", question, re.I):
        return AnswerKind("choice", (m.group(1), m.group(2)))
    if _YES_NO.search(question):
        return AnswerKind("yes_no")
    if _NUMBER.search(question):
        return AnswerKind("number")
    return AnswerKind("text")


def response_format(kind: AnswerKind) -> dict[str, Any]:
    """The JSON schema of the final answer: ``value`` (typed) first, then ``answer``."""
    schemas: dict[str, dict[str, Any]] = {
        "number": {"type": "number"},
        "yes_no": {"type": "boolean"},
        "choice": {"type": "string", "enum": list(kind.choices)},
        "text": {"type": "string", "maxLength": 120},
    }
    return final_answer_format({"value": schemas[kind.kind], "answer": {"type": "string"}})


def final_answer_format(properties: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` of a final answer: a strict object of these properties, all
    required, in this order."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "final_answer",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def render(kind: AnswerKind, parsed: dict[str, Any]) -> str:
    """The text shown for a typed reply: the sentence when it states the value, else the
    value first."""
    value, sentence = parsed.get("value"), str(parsed.get("answer") or "").strip()
    if kind.kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        shown = _number_text(float(value))
        stated = any(
            float(x.replace(",", "")) == float(value)
            for x in re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?", sentence)
        )
        return sentence if stated else f"{shown}. {sentence}".strip()
    if kind.kind == "yes_no" and isinstance(value, bool):
        word = "Yes" if value else "No"
        lead = re.match(r"^\s*(yes|no)\b", sentence, re.I)
        if lead and lead.group(1).lower() == word.lower():
            return sentence
        rest = sentence[lead.end() :].lstrip(" ,.") if lead else sentence
        return f"{word}. {rest}".strip()
    if kind.kind == "choice" and isinstance(value, str):
        others = [c for c in kind.choices if c != value]
        named_other = any(re.search(rf"\b{re.escape(o)}\b", sentence, re.I) for o in others)
        return value if named_other else f"{value}. {sentence}".strip()
    if isinstance(value, str) and value and value.lower() not in sentence.lower():
        return f"{value}. {sentence}".strip()
    return sentence


def _key(parsed: dict[str, Any]) -> str:
    value = parsed.get("value")
    if value is not None and value != "":
        return repr(round(value, 6) if isinstance(value, float) else value)
    text = str(parsed.get("answer") or "").lower()
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
    return " ".join(numbers) if numbers else re.sub(r"\W+", " ", text).strip()


def vote(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply most samples agree with (by typed value, else by the numbers or words of
    the answer); ties go to the earliest sample."""
    if not replies:
        return {}
    counts = Counter(_key(r) for r in replies)
    best = max(counts.values())
    return next(r for r in replies if counts[_key(r)] == best)
