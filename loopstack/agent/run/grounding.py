"""Grounding a forced final answer in what the tools really returned.

The small default model, asked for the final answer, sometimes writes something that is not
one: the call it would have made (``time__get_current_time({``), a bare argument
(``fahrenheit``), an unevaluated expression (``{2480 * 0.175}``), a claim of an action no tool
performed ("I created hello.txt" when nothing was written), or the same sentence until the
token cap. `problems` names these; `repair` turns such an answer into one the user can trust:

* a repeated tail is cut at its first repetition;
* an echo, a bare argument or an expression is replaced by the tool results themselves;
* a claimed action that no tool performed is retracted, with the results;
* an answer that carries no value of any successful result gets the results appended.

It never invents: every value it adds comes from a successful tool result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loopstack.agent.core.state import AgentState, Observation
from loopstack.text import mentions

__all__ = ["Repair", "evidence", "problems", "repair"]

# past-tense claims -> the stems a tool that performs them has in its name
_ACTIONS = {
    "created": ("create", "write", "save", "make", "add"),
    "wrote": ("write", "create", "save"),
    "written": ("write", "create", "save"),
    "saved": ("save", "write", "create", "remember", "store"),
    "sent": ("send", "email", "mail", "post"),
    "emailed": ("send", "email", "mail"),
    "deleted": ("delete", "remove"),
    "removed": ("delete", "remove"),
    "transferred": ("transfer", "pay", "send"),
    "booked": ("book", "reserve"),
    "scheduled": ("schedule", "book", "calendar"),
    "renamed": ("rename", "move"),
    "moved": ("move", "rename"),
}
_CLAIM = re.compile(
    r"\b(?:i|i've|i have|has been|have been|was|were|is now|successfully)\s+(?:\w+\s+)?("
    + "|".join(_ACTIONS)
    + r")\b",
    re.IGNORECASE,
)
_EXPRESSION = re.compile(
    r"\{[^{}]*\d[^{}]*[-+*/^][^{}]*\}"  # {2480 * 0.175}
    r"|\b(?:math|np|numpy)\.\w+\("  # math.ceil(125.0 + 19)
    r"|^\s*[-+(]*\d[\d.\s]*(?:[-+*/^%]\s*[(\d][\d.\s()]*)+=?\s*$"  # a bare 2480 * 0.175
)
_ISO = re.compile(r"\b(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})")
_REPEAT = re.compile(r"(.{12,}?)(?:\s*\1){2,}", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Repair:
    answer: str
    problems: tuple[str, ...]  # empty when the answer was kept as written


def _ok(state: AgentState) -> list[Observation]:
    return [o for o in state.observations if o.status == "ok"]


def _data(o: Observation) -> Any:
    try:
        body = json.loads(o.content)
    except (json.JSONDecodeError, TypeError):
        return o.content
    return body.get("data", body) if isinstance(body, dict) else body


def _values(value: Any) -> list[str]:
    """The leaf values of a result, as text (numbers and strings of 2+ characters)."""
    if isinstance(value, dict):
        return [v for x in value.values() for v in _values(x)]
    if isinstance(value, list):
        return [v for x in value for v in _values(x)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return [text] if len(text) >= 2 or text.isdigit() else []


def _flat(value: Any, limit: int) -> str:
    if isinstance(value, dict):
        text = ", ".join(f"{k} {_flat(v, limit)}" for k, v in value.items() if k != "summary")
    elif isinstance(value, list):
        text = "; ".join(_flat(v, limit) for v in value[:8]) + ("; ..." if len(value) > 8 else "")
    elif isinstance(value, str):
        text = _ISO.sub(r"\1 \2", value)  # 2026-12-02T13:01:31 reads as 2026-12-02 13:01:31
    else:
        text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def evidence(state: AgentState, limit: int = 3) -> str:
    """The latest successful tool results, as a sentence each."""
    shown = _ok(state)[-limit:]
    return " ".join(f"From {o.name}: {_flat(_data(o), 400)}." for o in shown)


def _contains(answer: str, value: str) -> bool:
    # loopstack.memory.evidence reads numbers with their scale ("12万", "120k"), dates as dates
    # ("3月3日" = "2026-03-03") and CJK text without word boundaries.
    return mentions(answer, value)


def problems(answer: str, state: AgentState, tool_names: set[str] | frozenset[str]) -> list[str]:
    """Why ``answer`` is not a final answer the user can trust (empty when it is)."""
    found: list[str] = []
    text = answer.strip()
    names = set(tool_names) | {o.name for o in state.observations}
    if not text:
        found.append("empty")
    if any(re.search(rf"\b{re.escape(n)}\s*\(", text) for n in names) or re.search(
        r'^\s*\{\s*"(?:name|arguments)"', text
    ):
        found.append("echoes a tool call")
    arguments = {
        str(v).strip().lower() for o in state.observations for v in o.arguments.values() if v
    }
    if text and text.rstrip(".").lower() in arguments:
        found.append("is a bare call argument")
    if _EXPRESSION.search(text):
        found.append("leaves an expression unevaluated")
    performed = " ".join(o.name.lower() for o in _ok(state))
    for claim in {m.group(1).lower() for m in _CLAIM.finditer(text)}:
        if not any(stem in performed for stem in _ACTIONS[claim]):
            found.append(f"claims '{claim}' though no tool did that")
    ok = _ok(state)
    given = " ".join(state.user_messages).lower()  # what the user said proves nothing
    learned = [
        v
        for o in ok
        for v in _values(_data(o))
        if v.lower() not in arguments and v.lower() not in given
    ]
    if learned and text and not any(_contains(text, v) for v in learned):
        found.append("carries no value from the tool results")
    return found


def repair(answer: str, state: AgentState, tool_names: set[str] | frozenset[str]) -> Repair:
    """The answer as written when nothing is wrong, else the repaired one (see the module)."""
    text = answer.strip()
    cut = _REPEAT.search(text)
    found: list[str] = []
    if cut:
        text = (text[: cut.start()] + cut.group(1)).strip()
        found.append("repeats itself")
    issues = problems(text, state, tool_names)
    found += issues
    if not issues:
        return Repair(text, tuple(found))
    facts = evidence(state) or "No tool returned a result."
    replace = {"empty", "echoes a tool call", "is a bare call argument"}
    replace.add("leaves an expression unevaluated")
    if any(i.startswith("claims") for i in issues):
        text = f"That was not done: no tool call performed it. {facts}"
    elif replace & set(issues):
        text = facts
    else:  # a plain answer without a value from the results: keep it, show the results
        text = f"{text} ({facts})"
    return Repair(text, tuple(found))
