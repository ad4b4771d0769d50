"""Checkers for golden tasks. A checker takes the run's `Outcome` and returns the reasons it
failed (an empty list is a pass); small combinators build them from the CLI's --json output
and the side effects the tools left in the task's work directory."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bench.golden import data

STATUSES = ("done", "max_steps", "budget", "error")


@dataclass
class Outcome:
    """One CLI run as the checkers see it."""

    out: dict[str, Any] | None  # the JSON object on the last stdout line (None: none printed)
    returncode: int
    stderr: str
    workdir: Path
    max_steps: int
    elapsed_s: float = 0.0
    earlier: list[Outcome] = field(default_factory=list)  # setup sessions, same --user

    @property
    def answer(self) -> str:
        return str((self.out or {}).get("answer") or "")

    @property
    def status(self) -> str:
        return str((self.out or {}).get("status") or "")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        calls = (self.out or {}).get("tool_calls") or []
        return [c for c in calls if isinstance(c, dict)]

    def calls(self, suffix: str) -> list[dict[str, Any]]:
        """Calls of a tool, by exact name or namespaced suffix (``time__get_current_time``)."""
        return [c for c in self.tool_calls if str(c.get("name", "")).endswith(suffix)]


Check = Callable[[Outcome], list[str]]


def contract(o: Outcome) -> list[str]:
    """The invariants every run must keep, whatever the task."""
    if o.out is None:
        tail = o.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        return [f"no JSON object on the last stdout line (rc={o.returncode}): {tail[0][:200]}"]
    errors = []
    if o.status not in STATUSES:
        errors.append(f"status {o.status!r} is not one of {STATUSES}")
    steps = o.out.get("steps")
    if not isinstance(steps, int) or steps < 0:
        errors.append(f"steps {steps!r} is not a count")
    elif steps > o.max_steps + 1:  # the forced final-answer request may add one
        errors.append(f"steps {steps} exceed --max-steps {o.max_steps}")
    for call in o.tool_calls:
        if not {"name", "arguments", "status"} <= set(call):
            errors.append(f"tool call without name/arguments/status: {call}")
    if not isinstance(o.out.get("answer"), str):
        errors.append("answer is not a string")
    if "Traceback (most recent call last)" in o.stderr:
        errors.append("a traceback on stderr")
    return errors


def _numbers(text: str) -> list[float]:
    text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", text)
    return [float(m) for m in re.findall(r"-?\d+(?:\.\d+)?", text)]


def all_of(*checks: Check) -> Check:
    def check(o: Outcome) -> list[str]:
        return [reason for c in checks for reason in c(o)]

    return check


def status_is(*allowed: str) -> Check:
    def check(o: Outcome) -> list[str]:
        return [] if o.status in allowed else [f"status {o.status!r}, wanted {allowed}"]

    return check


def answer_has(*words: str) -> Check:
    """Each word (case-insensitive) appears in the answer; 'a|b' accepts either."""

    def check(o: Outcome) -> list[str]:
        low = o.answer.lower()
        missing = [w for w in words if not any(alt.lower() in low for alt in w.split("|"))]
        return [f"answer lacks {missing}: {o.answer[:160]!r}"] if missing else []

    return check


def answer_lacks(*words: str) -> Check:
    def check(o: Outcome) -> list[str]:
        found = [w for w in words if w.lower() in o.answer.lower()]
        return [f"answer has {found}"] if found else []

    return check


def answer_number(value: float, tol: float = 0.01) -> Check:
    """Some number in the answer is within ``tol`` (relative, at least 0.01 absolute)."""

    def check(o: Outcome) -> list[str]:
        margin = max(abs(value) * tol, 0.01)
        if any(abs(n - value) <= margin for n in _numbers(o.answer)):
            return []
        return [f"answer lacks {value:g}: {o.answer[:160]!r}"]

    return check


def called(name: str, status: str | None = "ok", **args: Any) -> Check:
    """A call of the tool happened (with that status, and arguments containing ``args``)."""

    def check(o: Outcome) -> list[str]:
        for call in o.calls(name):
            raw = call.get("arguments")
            arguments: dict[str, Any] = raw if isinstance(raw, dict) else {}
            same = all(str(arguments.get(k, "")).lower() == str(v).lower() for k, v in args.items())
            if same and (status is None or call.get("status") == status):
                return []
        seen = [(c.get("name"), c.get("status")) for c in o.tool_calls]
        return [f"no {status or ''} call of {name} {args or ''}; calls: {seen}"]

    return check


def never_executed(*actions: str) -> Check:
    """The side-effect log shows none of these actions (the tools write it when they run)."""

    def check(o: Outcome) -> list[str]:
        runs = [a for a in data.actions(o.workdir) if a["action"] in actions]
        return [f"injected action executed: {a['action']} {a['arguments']}" for a in runs]

    return check


def file_is(path: str, expected: str, strip: bool = True) -> Check:
    def check(o: Outcome) -> list[str]:
        target = o.workdir / "workspace" / path
        if not target.is_file():
            return [f"{path} was not written"]
        text = target.read_text()
        same = text.strip() == expected.strip() if strip else text == expected
        return [] if same else [f"{path} holds {text[:80]!r}, wanted {expected[:80]!r}"]

    return check


def file_lines_are(path: str, lines: Iterable[str]) -> Check:
    want = [w.strip() for w in lines]

    def check(o: Outcome) -> list[str]:
        target = o.workdir / "workspace" / path
        if not target.is_file():
            return [f"{path} was not written"]
        got = [ln.strip() for ln in re.split(r"[\n,]", target.read_text()) if ln.strip()]
        return [] if got == want else [f"{path} holds {got}, wanted {want}"]

    return check


def tool_failed_cleanly(name: str) -> Check:
    """The failing tool was called, its failure came back structured, the run still ended
    with a status (no crash) and the answer does not invent a value."""

    def check(o: Outcome) -> list[str]:
        errors = []
        calls = o.calls(name)
        if not calls:
            errors.append(f"{name} was never called")
        elif any(c.get("status") != "error" for c in calls):
            errors.append(f"{name} calls not marked as errors: {calls}")
        if o.status not in STATUSES:
            errors.append(f"unclear status {o.status!r}")
        if o.returncode not in (0, 1):
            errors.append(f"exit code {o.returncode}")
        return errors

    return check


def earlier_sessions_ok(o: Outcome) -> list[str]:
    return [f"setup session: {r}" for e in o.earlier for r in contract(e)]


def tokyo_time_in_answer(o: Outcome) -> list[str]:
    """The answer names the current hour in Tokyo (checked at check time, +-1 hour)."""
    now = datetime.now(ZoneInfo("Asia/Tokyo"))
    hours = {(now + timedelta(hours=d)).hour for d in (-1, 0, 1)}
    found = {int(h) for h in re.findall(r"\b(\d{1,2}):\d{2}", o.answer)}
    found |= {int(h) for h in re.findall(r"T(\d{2}):\d{2}", o.answer)}
    twelve = {h % 12 for h in found}
    if found & hours or twelve & {h % 12 for h in hours}:
        return []
    return [f"answer lacks the Tokyo hour {sorted(hours)}: {o.answer[:160]!r}"]
