"""``loopstack.no_repeat``: a call identical to one already executed in the conversation (an
assistant ``tool_calls`` entry whose ``tool_call_id`` has a ``role: tool`` reply; same name,
same arguments) is not admitted by the turn's grammar: the model must write text or a
different call. `executed_calls` reads them from the history, `excluding` rewrites a tool's
schema into the values it admits minus those calls, `without_answered` applies it to a turn's
tools. Grammar backends only (guidance, xgrammar: their `resolve`); the outlines path ignores
it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import jsonschema

from loopstack.serving.exceptions import InvalidRequest

__all__ = ["MAX_BRANCHES", "excluding", "executed_calls", "without_answered"]

logger = logging.getLogger(__name__)

MAX_BRANCHES = 32  # alternatives one tool's exclusion schema may grow to
_MAX_STRING_POSITIONS = 64  # a string differs in one of its first 64 characters, or in length


def executed_calls(messages: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Tool name -> the argument objects of its calls that got a ``role: tool`` reply."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            if c.get("id") not in answered or not fn.get("name"):
                continue
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args or "{}")
                except json.JSONDecodeError:
                    continue
            if isinstance(args, dict) and args not in out.setdefault(fn["name"], []):
                out[fn["name"]].append(args)
    return out


_NO_VALUE = object()  # `_differs`: no value of the subschema differs from the given one


def _hex(ch: str) -> str:
    """One character as an escape both Python's re and Rust's regex read."""
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _lit(text: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else _hex(c) for c in text)


def _string_other_than(value: str, lo: int, hi: int | None) -> str | None:
    """A whole-string pattern for strings of length ``lo..hi`` that are neither `value` nor
    `value` with more after it: a shorter string, or one that differs in one of its first
    characters. (Extensions are refused too: kept from its call, a small model wrote
    ``"Paris}}"`` for ``"Paris"``.)"""
    n = len(value)
    if n == 0:  # every string extends "": any other one
        return None if hi == 0 else f"^[\\s\\S]{{{max(lo, 1)},{'' if hi is None else hi}}}$"
    alts = []
    if lo <= n - 1:
        alts.append(f"[\\s\\S]{{{lo},{min(n - 1, hi) if hi is not None else n - 1}}}")
    for i, ch in enumerate(value[:_MAX_STRING_POSITIONS]):
        if hi is not None and i + 1 > hi:
            break
        top = "" if hi is None else str(hi - i - 1)
        alts.append(f"{_lit(value[:i])}[^{_hex(ch)}][\\s\\S]{{{max(lo - i - 1, 0)},{top}}}")
    return f"^(?:{'|'.join(alts)})$" if alts else None


def _char(c: str) -> str:
    """`c` and its other case, as class members."""
    both = {c, c.lower(), c.upper()} if len(c.lower()) == len(c.upper()) == 1 else {c}
    return "".join(_hex(x) for x in sorted(both))


def _strings_other_than(values: list[str]) -> str:
    """A whole-string pattern for strings that are none of `values` and extend none of them,
    read without leading whitespace and without case (each value up to its first
    `_MAX_STRING_POSITIONS` characters), from their trie. Kept from its call, a small model
    wrote ``"Paris}}"`` and then ``" Paris"`` for ``"Paris"``: the same call again."""
    cut = sorted({v.lstrip().lower()[:_MAX_STRING_POSITIONS] for v in values} - {""})
    empty = any(not v.strip() for v in values)  # "" (or blanks): every string extends it

    def node(prefix: str) -> str | None:
        if prefix in cut:
            return None  # this value, and everything after it, is refused
        n = len(prefix)
        nxt = sorted({v[n] for v in cut if len(v) > n and v.startswith(prefix)})
        alts = [] if empty and not prefix else [""]
        blank = "\\s" if not prefix else ""  # leading whitespace is read past, not a start
        alts.append(f"[^{blank}{''.join(_char(c) for c in nxt)}][\\s\\S]*")
        for c in nxt:
            rest = node(prefix + c)
            if rest is not None:
                alts.append(f"[{_char(c)}]{rest}")
        return "(?:" + "|".join(alts) + ")"

    return f"^\\s*{node('')}$"  # the root is never a value: "" is left out of `cut`


_Made = dict[int, tuple[dict[str, Any], list[str]]]


def _differs(sub: Any, value: Any, made: _Made) -> Any:
    """A subschema admitting the values of `sub` other than `value`; None when that cannot be
    said in a schema every backend reads (the property is then left as it is); `_NO_VALUE`
    when no other value is admitted. `made` remembers the string patterns written here, so
    a second value of the same property is added to the first instead of refused."""
    if not isinstance(sub, dict):
        return None
    if id(sub) in made and isinstance(value, str):
        original, values = made[id(sub)]
        if value in values:
            return sub
        out = {**original, "pattern": _strings_other_than([*values, value])}
        made[id(out)] = (original, [*values, value])
        return out
    if isinstance(sub.get("enum"), list):
        rest = [v for v in sub["enum"] if v != value]
        return {**sub, "enum": rest} if rest else _NO_VALUE
    if "const" in sub:
        return _NO_VALUE if sub["const"] == value else sub
    kind = sub.get("type")
    if kind == "boolean" and isinstance(value, bool):
        return {**sub, "enum": [not value]}
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        below = {**sub, "maximum": min(value - 1, sub.get("maximum", value - 1))}
        above = {**sub, "minimum": max(value + 1, sub.get("minimum", value + 1))}
        return {"anyOf": [below, above]}
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        plain = {k: v for k, v in sub.items() if k not in ("exclusiveMaximum", "exclusiveMinimum")}
        return {
            "anyOf": [{**plain, "exclusiveMaximum": value}, {**plain, "exclusiveMinimum": value}]
        }
    if kind == "string" and isinstance(value, str):
        if "pattern" in sub or "format" in sub:
            return None
        lo = int(sub.get("minLength", 0))
        hi = sub.get("maxLength")
        if lo == 0 and hi is None:  # the usual case: a pattern that takes more values later
            out = {**sub, "pattern": _strings_other_than([value])}
            made[id(out)] = (sub, [value])
            return out
        pattern = _string_other_than(value, lo, int(hi) if hi is not None else None)
        if pattern is None:
            return _NO_VALUE
        others = {k: v for k, v in sub.items() if k not in ("minLength", "maxLength")}
        return {**others, "pattern": pattern}  # lengths folded in (llguidance: not both)
    return None


def _object_branches(
    schema: dict[str, Any], args: dict[str, Any], made: _Made
) -> tuple[list[dict[str, Any]], bool]:
    """Object schemas whose union is `schema` minus the one value `args` (a sound subset),
    and whether some property's difference could not be said (then the list falls short)."""
    props = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(props, dict):
        return [], True
    required = list(schema.get("required") or [])
    out, unsure = [], False
    for name, sub in props.items():
        if name in args:
            other = _differs(sub, args[name], made)
            if other is None:
                unsure = True
                continue
            if other is _NO_VALUE:
                continue
            out.append(
                {
                    **schema,
                    "properties": {**props, name: other},
                    "required": required if name in required else [*required, name],
                }
            )
        elif name not in required:  # present where the executed call left it out
            out.append({**schema, "required": [*required, name]})
    return out, unsure


def _admits(schema: dict[str, Any], value: Any) -> bool:
    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    except (jsonschema.SchemaError, re.error, TypeError):  # then it is refined anyway
        return True


def excluding(schema: Any, calls: list[dict[str, Any]]) -> Any:
    """`schema` without the argument objects in `calls`; None when nothing is left (a tool
    without parameters, once called). Left as it is where that cannot be said (no listed
    properties, ``$ref``, composition keywords, an argument whose difference needs a
    ``pattern`` beside another), or past `MAX_BRANCHES` alternatives: the host's own
    repeat check stays behind it."""
    if not calls or not isinstance(schema, dict):
        return schema
    if schema.keys() & {"anyOf", "oneOf", "allOf", "$ref"}:
        return schema
    if not isinstance(schema.get("properties"), dict):
        return schema
    branches: list[dict[str, Any]] = [schema]
    made: _Made = {}
    for args in calls:
        nxt: list[dict[str, Any]] = []
        for branch in branches:
            if not _admits(branch, args):  # refused there already: nothing to take out
                nxt.append(branch)
                continue
            got, unsure = _object_branches(branch, args, made)
            nxt.extend(got if got or not unsure else [branch])
        if len(nxt) > MAX_BRANCHES:
            logger.info("no_repeat: %d alternatives; the rest is left to the host", len(nxt))
            break
        branches = nxt
    if not branches:
        return None
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def without_answered(
    schemas: dict[str, Any], answered: dict[str, list[dict[str, Any]]], mode: str
) -> dict[str, Any]:
    """A turn's tool schemas minus the calls already made and answered (``no_repeat``):
    tools with nothing left are gone. In ``required``/named mode a turn with no call left to
    make is a 400; in ``auto`` the caller answers in text."""
    out = {}
    for name, schema in schemas.items():
        left = excluding(schema, answered.get(name, []))
        if left is not None:
            out[name] = left
    if len(out) < len(schemas) or any(out[n] is not schemas[n] for n in out):
        logger.info("no_repeat: %d answered call(s) excluded", sum(map(len, answered.values())))
    if not out and mode != "auto":
        raise InvalidRequest(
            "every call the tools admit was already made and answered (loopstack.no_repeat)",
            param="tool_choice",
        )
    return out
