"""Regular expressions that constrain decoding, built with Outlines.

Outlines (``outlines_core``) turns a JSON Schema into a regex that vLLM's ``outlines``
structured-output backend enforces token by token. Two gaps are closed here:

* numeric bounds - outlines_core's integer/number regex ignores ``minimum``/``maximum``
  (a 5..9 field can come out as 100). Every bounded numeric node is swapped for a placeholder
  before Outlines builds the regex, and the placeholder is then replaced by a regex of exactly
  the allowed range (integers), or of a sound subset of it (non-integral number bounds).
* keywords no regex expresses (``multipleOf``, ``uniqueItems``, ``not``, ...) - such schemas
  are marked ``exact=False``: their output is still checked with jsonschema, and a failure is
  retried or refused, never passed on.

`tool_call_regex` wraps argument regexes into Qwen/Hermes' ``<tool_call>`` envelope.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from outlines_core.json_schema import build_regex_from_schema

from serving.exceptions import InvalidRequest

WHITESPACE = ""  # compact JSON: each optional space costs automaton states (~25% compile)
MAX_COUNTED = 16  # largest {m,n} / maxLength / maxItems compiled into a regex
# Past this a schema's automaton took 20-60 s and GiBs to compile on 2 cores (see
# bench.constraint_compile); one made vLLM run out of memory. Refused with a 400 instead.
MAX_REGEX_CHARS = 20_000
_PLACEHOLDER = "LSNUMRANGE{}X"
# Keywords whose meaning no regex built here enforces: output must be re-validated.
_INEXACT_KEYWORDS = frozenset(
    {
        "multipleOf",
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "minProperties",
        "maxProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_SINGLE = ("items", "additionalProperties")


@dataclass(frozen=True)
class CompiledSchema:
    """A JSON schema, its constraining regex, and a validator for the final check."""

    schema: dict[str, Any]
    regex: str
    exact: bool
    validator: Draft202012Validator = field(compare=False, repr=False)

    def errors(self, value: Any) -> list[str]:
        return [e.message for e in self.validator.iter_errors(value)]


def compile_schema(schema: Any, *, what: str = "schema") -> CompiledSchema:
    """Check `schema`, then build its regex. Raises InvalidRequest for a bad schema."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{what} must be a JSON object", param=what)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidRequest(
            f"{what} is not a valid JSON Schema: {exc.message}", param=what
        ) from exc
    work = copy.deepcopy(schema)
    ranges: list[str] = []
    exact = _rewrite_bounds(work, ranges, what)
    try:
        regex = build_regex_from_schema(json.dumps(work), whitespace_pattern=WHITESPACE)
    except Exception as exc:  # outlines_core raises ValueError/TypeError for what it can't do
        raise InvalidRequest(
            f"{what} uses JSON Schema that cannot be enforced: {exc}", param=what
        ) from exc
    for i, rng in enumerate(ranges):
        regex = regex.replace(f'"{_PLACEHOLDER.format(i)}"', f"({rng})")
    if len(regex) > MAX_REGEX_CHARS:
        raise InvalidRequest(
            f"{what} is too complex to enforce: its constraint is {len(regex):,} characters "
            f"of regex (limit {MAX_REGEX_CHARS:,}); vLLM would spend minutes and many GiB "
            "compiling it. Flatten nested optional objects or split the tool.",
            param=what,
            code="schema_too_complex",
        )
    return CompiledSchema(schema, regex, exact, Draft202012Validator(schema))


def _rewrite_bounds(node: Any, ranges: list[str], what: str) -> bool:
    """Replace bounded numeric nodes by placeholders, in place. Returns False if inexact."""
    if not isinstance(node, dict):
        return True
    exact = not (_INEXACT_KEYWORDS & node.keys())
    # outlines_core reads oneOf as anyOf (a value fitting two branches gets through) and
    # concatenates the branches of allOf (the result is not even JSON).
    if len(node.get("oneOf") or []) > 1:
        exact = False
    if len(node.get("allOf") or []) > 1:
        raise InvalidRequest(
            f"{what} uses allOf with several subschemas, which cannot be enforced", param=what
        )
    for key in _SUBSCHEMA_LISTS:
        for sub in node.get(key) or []:
            exact &= _rewrite_bounds(sub, ranges, what)
    for key in _SUBSCHEMA_MAPS:
        for sub in (node.get(key) or {}).values():
            exact &= _rewrite_bounds(sub, ranges, what)
    for key in _SUBSCHEMA_SINGLE:
        exact &= _rewrite_bounds(node.get(key), ranges, what)
    exact &= _relax_sizes(node)
    kind = node.get("type")
    bounded = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & node.keys()
    if isinstance(kind, list) and bounded and {"integer", "number"} & set(kind):
        return False  # outlines_core ignores the bounds of a type list: validate the output
    if kind in ("integer", "number") and bounded:
        lo, hi, is_int = _bounds(node, integer=kind == "integer")
        if lo is not None and hi is not None and lo > hi:
            if is_int or _real_range_empty(node):
                raise InvalidRequest(
                    f"{what} has a numeric range with no values: {node}", param=what
                )
            return False  # no integer inside, e.g. (0, 1): unbounded regex, validated output
        rng = int_range_regex(lo, hi) if is_int else number_range_regex(lo, hi)
        placeholder = _PLACEHOLDER.format(len(ranges))
        ranges.append(rng)
        for key in list(node):
            if key not in ("description", "title", "default", "examples"):
                del node[key]
        node.update({"type": "string", "pattern": placeholder})
    return exact


def _relax_sizes(node: dict[str, Any]) -> bool:
    """Drop counted repetition the automaton cannot afford. Returns False if anything went.

    Outlines compiles the regex into an automaton whose every state is walked against the
    whole vocabulary (~150k tokens for Qwen): ``maxLength: 1024`` alone is 1024 states, and
    real-world schemas carry dozens of such bounds (vLLM ran out of 24 GiB on one). Bounds
    above `MAX_COUNTED` are therefore left to the final jsonschema check.
    """
    exact = True
    items = node.get("items")
    # Counted arrays of objects repeat the whole object automaton: keep them uncounted.
    item_limit = 1 if isinstance(items, dict) and not _is_scalar(items) else MAX_COUNTED
    limits = {"minLength": MAX_COUNTED, "maxLength": MAX_COUNTED}
    limits.update(minItems=item_limit, maxItems=item_limit if item_limit > 1 else 0)
    for key, limit in limits.items():
        value = node.get(key)
        if isinstance(value, int) and value > limit:
            del node[key]
            exact = False
    pattern = node.get("pattern")
    if isinstance(pattern, str) and {"minLength", "maxLength"} & node.keys():
        # Outlines builds a length-only regex when lengths are present and drops the
        # pattern: keep the (more specific) pattern, check the lengths afterwards.
        node.pop("minLength", None)
        node.pop("maxLength", None)
        exact = False
    if isinstance(pattern, str):
        relaxed = _COUNTED.sub(_uncount, pattern)
        if relaxed != pattern:
            exact = False
        node["pattern"], safe_exact = json_safe_pattern(relaxed)
        exact &= safe_exact
    return exact


_STRING_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'
_NEGATED_SHORTHAND = {"S": r"\s", "W": r"\w", "D": r"\d"}


def json_safe_pattern(pattern: str) -> tuple[str, bool]:
    """Make a `pattern` match only characters a JSON string can hold unescaped.

    Outlines puts the pattern between quotes as is, so ``.`` or ``[^a]`` would admit ``"``,
    ``\\`` and control characters: output that is not JSON, and an automaton that explodes
    (``arn:.*:.*:.+`` took 13 s to compile, 1.3 s once made JSON-safe; ``[\\S\\s]+`` made
    vLLM run out of memory). ``.``, ``\\S``/``\\W``/``\\D`` and negated classes exclude the
    unsafe characters; ``\\s`` becomes a plain space. A positive class holding ``\\S``/``\\W``/
    ``\\D`` becomes "any safe character", a superset: the result is then marked inexact
    (second value False) so the output is validated. Anchors go: between the quotes the
    pattern must match the whole string anyway, and a ``^`` Outlines keeps is unsatisfiable.
    """
    unsafe = '"\\\\\\x00-\\x1F\\x7F-\\x9F'
    out: list[str] = []
    exact = True
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt in _NEGATED_SHORTHAND:
                out.append(f"[^{_NEGATED_SHORTHAND[nxt]}{unsafe}]")
            elif nxt == "s":
                out.append(" ")
            else:
                out.append(c + nxt)
            i += 2
        elif c == "[":
            j = i + 1
            negated = pattern.startswith("^", j)
            j += negated
            body_start = j
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            body = pattern[body_start:j]
            if negated:
                out.append(f"[^{unsafe}{_escape_leading_bracket(body)}]")
            elif any(f"\\{k}" in body for k in _NEGATED_SHORTHAND):
                out.append(_STRING_CHAR)
                exact = False
            else:
                out.append("[" + body.replace("\\s", " ") + "]")
            i = j + 1
        elif c == ".":
            out.append(_STRING_CHAR)
            i += 1
        elif c in "^$":
            i += 1  # anchors: the pattern already spans the whole string between the quotes
        else:
            out.append(c)
            i += 1
    return "(" + "".join(out) + ")", exact  # Outlines adds the quotes: keep `a|b` inside


def _escape_leading_bracket(body: str) -> str:
    return "\\]" + body[1:] if body.startswith("]") else body


def _is_scalar(schema: dict[str, Any]) -> bool:
    return schema.get("type") in ("string", "integer", "number", "boolean", "null") and not (
        {"anyOf", "oneOf", "allOf", "$ref"} & schema.keys()
    )


_COUNTED = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def _uncount(m: re.Match[str]) -> str:
    low = int(m.group(1))
    high = m.group(2)
    top = low if high is None else (int(high) if high else None)
    if top is not None and top <= MAX_COUNTED:
        return m.group(0)
    return "*" if low == 0 else "+"


def _bounds(node: dict[str, Any], *, integer: bool) -> tuple[int | None, int | None, bool]:
    """Integral inclusive bounds [lo, hi] that lie inside the node's bounds."""
    lo: int | None = None
    hi: int | None = None
    lo_ex, hi_ex = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(node.get("minimum"), int | float) and not isinstance(node["minimum"], bool):
        m = node["minimum"]
        lo = math.floor(m) + 1 if lo_ex is True and m == math.floor(m) else math.ceil(m)
    if isinstance(lo_ex, int | float) and not isinstance(lo_ex, bool):
        lo = max(lo if lo is not None else -(10**18), math.floor(lo_ex) + 1)
    if isinstance(node.get("maximum"), int | float) and not isinstance(node["maximum"], bool):
        m = node["maximum"]
        hi = math.ceil(m) - 1 if hi_ex is True and m == math.ceil(m) else math.floor(m)
    if isinstance(hi_ex, int | float) and not isinstance(hi_ex, bool):
        hi = min(hi if hi is not None else 10**18, math.ceil(hi_ex) - 1)
    # Integral bounds are exact for integers. For numbers they are exact when the original
    # bounds are integral and inclusive; otherwise [lo, hi] is a sound subset.
    return lo, hi, integer


def _real_range_empty(node: dict[str, Any]) -> bool:
    """Whether a number node's bounds admit no real value at all."""

    def num(key: str) -> Any:
        v = node.get(key)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    lows = [(v, ex) for v, ex in ((num("minimum"), False), (num("exclusiveMinimum"), True))]
    highs = [(v, ex) for v, ex in ((num("maximum"), False), (num("exclusiveMaximum"), True))]
    lows, highs = [t for t in lows if t[0] is not None], [t for t in highs if t[0] is not None]
    if not lows or not highs:
        return False
    lo, lo_ex = max(lows)
    hi, hi_ex = min(highs, key=lambda t: (t[0], not t[1]))
    return lo > hi or (lo == hi and (lo_ex or hi_ex))


# --------------------------------------------------------------------------- numeric ranges
def int_range_regex(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the JSON integers in [lo, hi] (None = unbounded)."""
    parts: list[str] = []
    if lo is None or lo < 0:  # negative values: -(|v|) with |v| in [max(1, -hi), -lo]
        a = 1 if hi is None or hi >= 0 else -hi
        b = None if lo is None else -lo
        parts += ["-" + p for p in _nonneg_int_patterns(a, b)]
    if hi is None or hi >= 0:
        parts += _nonneg_int_patterns(max(lo or 0, 0), hi)
    return "|".join(parts)


def number_range_regex(lo: int | None, hi: int | None) -> str:
    """JSON numbers in [lo, hi] for integral lo/hi: integer part in range, then a fraction."""
    frac, zero_frac = r"(\.[0-9]+)?", r"(\.0+)?"
    parts: list[str] = []
    if lo is None or lo < 0:  # negative side: |v| in (max(0,-hi), -lo]  or  [-hi, -lo]
        a = 0 if hi is None or hi >= 0 else -hi
        if lo is None:
            parts += ["-" + p + frac for p in _nonneg_int_patterns(a, None)]
        else:
            if a <= -lo - 1:
                parts += ["-" + p + frac for p in _nonneg_int_patterns(a, -lo - 1)]
            parts.append("-" + str(-lo) + zero_frac)
    if hi is None or hi >= 0:
        start = max(lo if lo is not None else 0, 0)
        if hi is None:
            parts += [p + frac for p in _nonneg_int_patterns(start, None)]
        else:
            if start <= hi - 1:
                parts += [p + frac for p in _nonneg_int_patterns(start, hi - 1)]
            parts.append(str(hi) + zero_frac)
    return "|".join(f"({p})" for p in parts)


def _nonneg_int_patterns(lo: int, hi: int | None) -> list[str]:
    """Alternatives matching the integers in [lo, hi], lo >= 0, written without leading 0s."""
    if hi is not None and lo > hi:
        return []
    out: list[str] = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for digits in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(top, 10**digits - 1)
        if a <= b:
            out += _same_length(str(a), str(b))
    if hi is None:
        out.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return out


def _same_length(a: str, b: str) -> list[str]:
    """Patterns for the numbers a..b written with the same number of digits (a <= b)."""
    if a == b:
        return [a]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + p for p in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    out: list[str] = []
    first_lo, first_hi = a[0], b[0]
    if a[1:] != "0" * n:
        out += [a[0] + p for p in _same_length(a[1:], "9" * n)]
        first_lo = chr(ord(a[0]) + 1)
    tail_hi = b[1:] != "9" * n
    if tail_hi:
        first_hi = chr(ord(b[0]) - 1)
    if first_lo <= first_hi:
        head = first_lo if first_lo == first_hi else f"[{first_lo}-{first_hi}]"
        out.append(head + f"[0-9]{{{n}}}")
    if tail_hi:
        out += [b[0] + p for p in _same_length("0" * n, b[1:])]
    return out


# --------------------------------------------------------------------------- tool envelope
def regex_literal(text: str) -> str:
    """Escape `text` for the regex dialect Outlines understands."""
    special = set(r"\.^$|?*+()[]{}/")
    return "".join("\\" + c if c in special else c for c in text)


def call_head(name: str) -> str:
    """The text of a call up to its arguments: ``{"name": "<name>", "arguments": ``."""
    return '{"name": "' + name + '", "arguments": '


def name_regex(names: list[str]) -> str:
    """Stage 1 of a call: the head, with the name chosen among `names`."""
    choice = "|".join(regex_literal(n) for n in names)
    return regex_literal('{"name": "') + f"({choice})" + regex_literal('", "arguments": ')


def arguments_regex(schema: CompiledSchema, *, parallel: bool) -> str:
    """Stage 2 of a call: its arguments and the closing brace, optionally ``\\n</tool_call>``;
    with `parallel`, then optionally the opening of another call (``\\n<tool_call>\\n``),
    after which the caller continues from stage 1.

    Splitting the call in two keeps every automaton the size of one schema, and lets vLLM's
    cache reuse a tool's automaton whatever other tools come with it: a union of several
    real-world schemas took minutes to compile, or exhausted memory.
    """
    tail = r"(\n</tool_call>(\n<tool_call>\n)?)?" if parallel else r"(\n</tool_call>)?"
    return f"({schema.regex})" + r"\}" + tail


def tool_call_regex(tools: dict[str, CompiledSchema], *, parallel: bool) -> str:
    """The whole language of one call (stage 1 then 2), for documentation and tests."""
    alternatives = [
        regex_literal(call_head(name)) + arguments_regex(c, parallel=parallel)
        for name, c in tools.items()
    ]
    return "(" + "|".join(f"({a})" for a in alternatives) + ")"
