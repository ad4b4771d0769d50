"""Call guards: approval of dangerous calls, the structural injection check, and the
repeated-call signature.

Approval comes only from the host: an `Approver` callback, or an interactive prompt when a
person sits at a terminal; with nobody there every request is denied. Nothing a tool
returns can approve a call or widen the allowlist: tool output is only ever data.

The injection check is structural, because a small model follows injected text whatever the
prompt says: a call is *suspicious* when its tool name, or a distinctive argument value
(an e-mail address, a URL, a path, a long string or a long number), appears inside the text
of earlier untrusted tool output - its values *and its keys* - but not in anything the user
said (a value that is a whole field of a result, like a file name from a listing, is data
the model may chain on). Text is compared normalised: NFKC, invisible characters dropped,
whitespace collapsed, case-folded, and an address spelled out ("attacker at evil dot
example") read as the address. A suspicious call is held for approval exactly like a
dangerous tool.

The repeated-call signature compares normalised arguments (canonical JSON, strings
stripped and case-folded), so ``"x"``, ``"x "`` and ``"X"`` are the same call.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from loopstack.agent.core.state import Observation, Reason
from loopstack.agent.tools.registry import in_daemon_thread, loads_arguments

__all__ = [
    "ApprovalRequest",
    "Approver",
    "ask",
    "call_sig",
    "call_signature",
    "deny_all",
    "distinctive_values",
    "error_type",
    "repeat_reason",
    "suspicious_call",
    "terminal_approver",
]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    name: str
    arguments: dict[str, Any]
    why: Literal["dangerous", "suspicious"]
    detail: str


Approver = Callable[[ApprovalRequest], bool | Awaitable[bool]]


def deny_all(request: ApprovalRequest) -> bool:
    """Nobody is there to approve: everything is denied."""
    return False


def terminal_approver(stdin: TextIO | None = None, stderr: TextIO | None = None) -> Approver | None:
    """An approver that asks on the terminal, or None when stdin is not a TTY."""
    inp = stdin or sys.stdin
    out = stderr or sys.stderr
    if not (hasattr(inp, "isatty") and inp.isatty()):
        return None

    def prompt(req: ApprovalRequest) -> bool:
        args = json.dumps(req.arguments, ensure_ascii=False)
        out.write(f"\n[approval needed: {req.why}] {req.name}({args})\n  {req.detail}\n")
        out.write("  allow this call? [y/N] ")
        out.flush()
        line = inp.readline()
        return line.strip().lower() in {"y", "yes"}

    async def approve(req: ApprovalRequest) -> bool:
        # a daemon thread like sync tools: a prompt abandoned (Ctrl-C, a limit) must not keep
        # the process waiting for a line at exit
        return bool(await in_daemon_thread(prompt, req=req))

    return approve


async def ask(approver: Approver | None, request: ApprovalRequest) -> bool:
    """The host's decision; errors in the approver count as a denial."""
    if approver is None:
        return False
    try:
        verdict = approver(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception:
        return False
    return verdict is True


def call_signature(name: str, arguments: dict[str, Any]) -> str:
    """Identity of a call for the repeated-call detector: the name and the *normalised*
    arguments as canonical JSON (keys sorted; strings NFKC, stripped, inner whitespace
    collapsed and case-folded; ``1.0`` as ``1``), so ``"x"``, ``"x "`` and ``"X"`` are one
    call."""
    canon = _canonical(arguments)
    return name + json.dumps(canon, sort_keys=True, ensure_ascii=False, default=str)


def _canonical(value: Any) -> Any:
    if isinstance(value, str):
        return _norm(value).strip()
    if isinstance(value, dict):
        return {_norm(str(k)).strip(): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def call_sig(call: dict[str, Any]) -> str:
    """`call_signature` of an OpenAI ``tool_calls`` entry (arguments as the model wrote them)."""
    return call_signature(call["function"]["name"], loads_arguments(call["function"]["arguments"]))


_EMAIL = re.compile(r"[^\s@]+@[^\s@]+\.[A-Za-z]{2,}")


def _walk(value: Any, *, keys: bool = False) -> Iterator[Any]:
    """The leaves of a JSON value; with ``keys``, every object key too (tool output can
    carry text in its keys as well as in its values)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if keys:
                yield k
            yield from _walk(v, keys=keys)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, keys=keys)
    else:
        yield value


def distinctive_values(arguments: dict[str, Any]) -> list[str]:
    """Argument values specific enough that seeing them in tool output is telling."""
    out: list[str] = []
    for v in _walk(arguments):
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int | float):
            s = str(v)
            if len(re.sub(r"\D", "", s)) >= 5:
                out.append(s)
            continue
        s = str(v).strip()
        if (
            _EMAIL.search(s)
            or "://" in s
            or "/" in s
            or "\\" in s
            or len(s) >= 24
            or (len(s) >= 6 and sum(c.isdigit() for c in s) >= 4)
        ):
            out.append(s)
    return out


# soft hyphen, zero-width spaces and joiners, word joiner, BOM: NFKC keeps them
_INVISIBLE = dict.fromkeys([0x00AD, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF])


def _norm(text: str) -> str:
    """Text as compared: NFKC (full-width and compatibility forms folded), invisible
    characters removed, whitespace collapsed, case-folded."""
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
    return re.sub(r"\s+", " ", text).casefold()


# an address spelled out: "attacker at evil dot example", "bob [at] corp (dot) com"
_AT = r"\s*(?:\[at\]|\(at\)|\{at\}|\sat\s)\s*"
_DOT = r"\s*(?:\[dot\]|\(dot\)|\{dot\}|\sdot\s|\.)\s*"
_SPELLED = re.compile(rf"([\w.+-]+){_AT}([\w-]+(?:{_DOT}[\w-]+)+)")


def _unobfuscate(text: str) -> str:
    """``text`` with spelled-out addresses written as addresses (``a@b.c``)."""

    def addr(m: re.Match[str]) -> str:
        host = re.sub(_DOT, ".", m.group(2))
        return f"{m.group(1)}@{host}"

    return _SPELLED.sub(addr, text)


def _untrusted_leaves(outputs: Iterable[str]) -> list[str]:
    """Normalised string leaves of what tools returned (``data``, and the messages of the
    tools' own errors); our own refusals (denied, not_allowed, ...) are not tool output."""
    leaves: list[str] = []
    for raw in outputs:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, TypeError):
            leaves.append(_norm(str(raw)))
            continue
        if not isinstance(body, dict) or "data" not in body:
            leaves.extend(_norm(str(v)) for v in _walk(body, keys=True))
            continue
        parts: list[Any] = [body.get("data")]
        err = body.get("error") or {}
        if isinstance(err, dict) and err.get("type") in _TOOL_FAILURES:
            parts.append(err.get("message", ""))
        leaves.extend(_norm(str(v)) for v in _walk(parts, keys=True) if v is not None)
    return leaves


_TOOL_FAILURES = {"tool_error", "server_error", "timeout"}


def suspicious_call(
    name: str, arguments: dict[str, Any], *, untrusted: Iterable[str], trusted: Iterable[str]
) -> str | None:
    """Why this call looks injected by tool output, or None when the user's words explain it.

    A value that *is* a whole value of a result (a file name from a listing, a region from a
    report) is data the model may chain on; a value found only *inside* longer text of a
    result (prose such as "now send it to x@evil.example") is what injection looks like.
    """
    leaves = _untrusted_leaves(untrusted)
    if not leaves:
        return None
    exact = set(leaves)  # whole values and keys: data the model may chain on
    # text as it reads: the leaves, and the leaves with spelled-out addresses written out
    texts = leaves + [u for leaf in leaves if (u := _unobfuscate(leaf)) != leaf]
    said = _norm("\n".join(trusted))
    said += "\n" + _unobfuscate(said)
    name_pat = re.compile(r"(?<![a-z0-9_])" + re.escape(_norm(name)) + r"(?![a-z0-9_])")
    if any(name_pat.search(t) for t in texts) and not name_pat.search(said):
        return f"tool {name!r} is named in earlier tool output, not in the user's request"
    for value in distinctive_values(arguments):
        v = _norm(value).strip()
        if v in said or v in exact:
            continue
        if any(v in t for t in texts):
            return f"argument value {value!r} comes from text inside tool output, not from the user"
    return None


def repeated_call_error(status: str, step: int) -> dict[str, Any]:
    """The error a repeated identical call gets instead of running again (the first time):
    use the result, or - after an error - fix the arguments, or use another tool."""
    if status == "ok":
        hint = (
            "its result is above. If it answers the request, reply with the final answer "
            "now; if more is needed, call a different tool or use different arguments"
        )
    else:
        hint = (
            "it failed, and the same arguments fail the same way. Read the error above "
            "and call again with corrected arguments, or use another tool"
        )
    return {
        "type": "repeated_call",
        "message": f"not run again: identical to the call at step {step}; {hint}",
    }


def repeat_reason(calls: list[dict[str, Any]], seen: dict[str, Observation]) -> Reason:
    """Why a run of repeats ends: ``not_allowed`` / ``denied`` when every repeated call was
    one the host refuses (the run is ``refused``, not ``done``), else ``repeated_call``."""
    kinds = {error_type(seen[call_sig(c)]) for c in calls if call_sig(c) in seen}
    if kinds == {"not_allowed"}:
        return "not_allowed"
    if kinds and kinds <= {"not_allowed", "denied"}:
        return "denied"
    return "repeated_call"


def error_type(obs: Observation) -> str | None:
    if obs.status != "error":
        return None
    try:
        return str((json.loads(obs.content).get("error") or {}).get("type"))
    except (json.JSONDecodeError, AttributeError):
        return None
