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

The ``outlines`` constraint backend alone uses it (`loopstack.serving.constraint.outlines`:
`name_regex` for a call's head, `arguments_regex` for its arguments, `compile_schema` for a
client's ``response_format`` / ``structured_outputs`` schema), through the sandbox and the
automaton probe (`loopstack.serving.constraint.regexes`). The grammar backends (``guidance``, the
default, and ``xgrammar``) take the JSON Schema itself and make no regex.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from loopstack.serving.constraint.envelope import CALL_SEPARATOR, TOOL_CALL_CLOSE, call_head
from loopstack.serving.constraint.patterns import (
    MAX_REGEX_CHARS,
    int_range_regex,
    json_safe_pattern,
    json_value_regex,
    number_range_regex,
    regex_literal,
)
from loopstack.serving.constraint.schema_limits import (
    HUGE_BOUND,
    SchemaLimits,
    check_schema_limits,
    fits_type,
)
from loopstack.serving.constraint.schemas import CompiledSchema, check_json_schema
from loopstack.serving.constraint.validation import SafeValidator
from loopstack.serving.constraint.walker import INEXACT_KEYWORDS, children
from loopstack.serving.exceptions import InvalidRequest

WHITESPACE = ""  # compact JSON: each optional space costs automaton states (~25% compile)
# Largest {m,n} / maxLength / maxItems compiled into a regex: RegexSchemas tries the first,
# and falls back to the second when the automaton probe finds the result too big.
COUNTED_LIMITS = (64, 16)
MAX_COUNTED = COUNTED_LIMITS[-1]
FREE_FORM_DEPTH = 2  # containers a free-form value may nest (Outlines allows about as many)
_PLACEHOLDER = "LSNUMRANGE{}X"
# The subschemas whose regex outlines_core builds (found by the one walker,
# `walker.children`): the rest are validated after generation, never in the regex.
_IN_THE_REGEX = frozenset(
    {"anyOf", "oneOf", "allOf", "prefixItems", "properties", "$defs", "definitions", "items",
     "additionalProperties"}
)  # fmt: skip


@dataclass
class _Rewrite:
    """What the rewrite of one schema carries along."""

    what: str
    defs: dict[str, Any]
    max_counted: int
    ranges: list[str] = field(default_factory=list)  # placeholder i -> its regex


def compile_schema(
    schema: Any,
    *,
    what: str = "schema",
    max_counted: int = MAX_COUNTED,
    limits: SchemaLimits | None = None,
) -> CompiledSchema:
    """Check `schema`, then build its regex. Raises InvalidRequest for a bad schema.
    Counted repetition above `max_counted` is left to the final jsonschema check.
    Synchronous and CPU-bound (bounded by `limits` and `MAX_REGEX_CHARS`): async callers run
    it in the sandbox (`loopstack.serving.constraint.regexes`)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{what} must be a JSON object", param=what)
    check_schema_limits(schema, what=what, limits=limits)
    check_json_schema(schema, what)
    work = copy.deepcopy(schema)
    defs = {k: work[k] for k in ("$defs", "definitions") if isinstance(work.get(k), dict)}
    ctx = _Rewrite(what, defs, max_counted)
    exact = True
    for key, table in defs.items():  # first, so that the objects built here see them rewritten
        for name in _def_order(table, key):
            exact &= _rewrite_bounds(table[name], ctx)
    exact &= _rewrite_bounds(work, ctx, root=True)
    regex = _outlines_regex(work, what)
    size = _expanded_size(regex, ctx.ranges)  # before anything is expanded
    if size > MAX_REGEX_CHARS:
        raise InvalidRequest(
            f"{what} is too complex to enforce: its constraint would be {size:,} characters "
            f"of regex (limit {MAX_REGEX_CHARS:,}). Flatten nested objects or split the tool.",
            param=what,
            code="schema_too_complex",
        )
    # A placeholder's regex holds only placeholders made before it: substitute newest first.
    for i in reversed(range(len(ctx.ranges))):
        regex = regex.replace(f'"{_PLACEHOLDER.format(i)}"', f"({ctx.ranges[i]})")
    return CompiledSchema(schema, regex, exact, SafeValidator(schema))


_PLACEHOLDER_REF = re.compile('"' + _PLACEHOLDER.format(r"(\d+)") + '"')


def _expanded_size(regex: str, ranges: list[str]) -> int:
    """The length `regex` will have once every placeholder is substituted, computed from the
    sizes of the pieces (placeholder i's regex holds only placeholders j < i), so that a
    schema whose regex would be billions of characters is refused without building it."""
    sizes: list[int] = []

    def size_of(text: str) -> int:
        total = len(text)
        for m in _PLACEHOLDER_REF.finditer(text):
            total += sizes[int(m.group(1))] + 2 - len(m.group(0))
        return total

    for piece in ranges:
        sizes.append(size_of(piece))
    return size_of(regex)


def _outlines_regex(schema: dict[str, Any], what: str) -> str:
    try:
        return build_regex_from_schema(json.dumps(schema), whitespace_pattern=WHITESPACE)
    except Exception as exc:  # outlines_core raises ValueError/TypeError for what it can't do
        raise InvalidRequest(
            f"{what} uses JSON Schema that cannot be enforced: {exc}", param=what
        ) from exc


def _placeholder(node: dict[str, Any], regex: str, ranges: list[str]) -> None:
    """Turn `node` into a string placeholder that is later replaced by `regex`."""
    placeholder = _PLACEHOLDER.format(len(ranges))
    ranges.append(regex)
    for key in list(node):
        if key not in ("description", "title", "default", "examples"):
            del node[key]
    node.update({"type": "string", "pattern": placeholder})


def _def_order(table: dict[str, Any], key: str) -> list[str]:
    """Names in `table` ($defs or definitions), each after the definitions it refers to."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in table:
            return
        seen.add(name)
        for ref in re.findall(rf'"\$ref": "#/{re.escape(key)}/([^"]+)"', json.dumps(table[name])):
            visit(ref)
        order.append(name)

    for name in table:
        visit(name)
    return order


def _rewrite_bounds(node: Any, ctx: _Rewrite, *, root: bool = False) -> bool:
    """Rewrite, in place, the nodes whose Outlines regex is wrong or too large into
    placeholders (bounded numbers, objects with only optional properties).
    Returns False if the result is inexact."""
    if not isinstance(node, dict):
        return True
    what = ctx.what
    exact = not (INEXACT_KEYWORDS & node.keys())
    # outlines_core reads oneOf as anyOf (a value fitting two branches gets through) and
    # concatenates the branches of allOf (the result is not even JSON).
    if len(node.get("oneOf") or []) > 1:
        exact = False
    if len(node.get("allOf") or []) > 1:
        raise InvalidRequest(
            f"{what} uses allOf with several subschemas, which cannot be enforced", param=what
        )
    for step, sub in children(node, negated=False):
        key = step.split("/")[1]
        if key not in _IN_THE_REGEX or (root and key in ("$defs", "definitions")):
            continue  # not in the regex; or the definitions, done first by compile_schema
        if key == "items" and isinstance(node["items"], list):
            continue  # a draft-07 tuple: outlines_core reads prefixItems
        exact &= _rewrite_bounds(sub, ctx)
    exact &= _relax_sizes(node, ctx.max_counted)
    _narrow_enum(node)
    if _plain_object(node):
        regex = _object_regex(node["properties"], node.get("required") or [], what, ctx.defs)
        if regex is not None:
            _placeholder(node, regex, ctx.ranges)
            return exact
    free = _free_form(node)
    if free is not None:
        _placeholder(node, free, ctx.ranges)
        return exact
    kind = node.get("type")
    bounded = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & node.keys()
    if isinstance(kind, list) and bounded and {"integer", "number"} & set(kind):
        return False  # outlines_core ignores the bounds of a type list: validate the output
    if kind in ("integer", "number") and bounded:
        if _drop_huge_bounds(node):
            exact = False  # e.g. maximum 1.8e308: that side is left open, and validated
            if not {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & node.keys():
                return exact
        lo, hi, is_int = _bounds(node, integer=kind == "integer")
        if lo is not None and hi is not None and lo > hi:
            if is_int or _real_range_empty(node):
                raise InvalidRequest(
                    f"{what} has a numeric range with no values: {node}",
                    param=what,
                    code="invalid_schema",
                )
            return False  # no integer inside, e.g. (0, 1): unbounded regex, validated output
        rng = int_range_regex(lo, hi) if is_int else number_range_regex(lo, hi)
        _placeholder(node, rng, ctx.ranges)
    return exact


def _drop_huge_bounds(node: dict[str, Any]) -> bool:
    """Remove bounds beyond +-`HUGE_BOUND` (permissive ones: `check_schema_limits` refused
    the others) from the working copy. Returns whether any went."""
    dropped = False
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = node.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) > HUGE_BOUND:
            del node[key]
            dropped = True
    return dropped


def _narrow_enum(node: dict[str, Any]) -> None:
    """Drop enum values of another type than the declared one (``type: string, enum:
    ["a", null]``): Outlines would offer them and validation refuse them."""
    kind, values = node.get("type"), node.get("enum")
    if isinstance(values, list) and isinstance(kind, str | list):
        kept = [v for v in values if fits_type(v, kind)]
        if kept and len(kept) < len(values):
            node["enum"] = kept


_ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly",
     "writeOnly", "$schema", "$id"}
)  # fmt: skip
# Keys that leave an object node to Outlines: it combines them with the properties in ways
# the regex built here does not. Every other key is an annotation or a keyword about other
# types, or an object keyword that makes the node inexact (`INEXACT_KEYWORDS`: validated).
# Outlines writes an object quadratically per level, so the fewer objects it sees the better
# (nested non-plain objects once grew a 5 KB schema into gigabytes inside outlines_core).
_OUTLINES_OBJECT_KEYS = frozenset(
    {"anyOf", "oneOf", "allOf", "$ref", "$dynamicRef", "enum", "const"}
)


def _plain_object(node: dict[str, Any]) -> bool:
    props = node.get("properties")
    return (
        isinstance(props, dict)
        and 0 < len(props) <= 100  # one regex nesting level per property (Rust's limit: 250)
        and isinstance(node.get("required", []), list)
        and node.get("type", "object") == "object"
        and not (node.keys() & _OUTLINES_OBJECT_KEYS)
    )


def _free_form(node: dict[str, Any]) -> str | None:
    """The regex of a node that allows any object / array / value, else None."""
    extra = node.keys() - _ANNOTATIONS
    kind = node.get("type")
    if kind == "object" and extra <= {"type", "additionalProperties"}:
        if node.get("additionalProperties", True) is True:
            return json_value_regex(FREE_FORM_DEPTH, "object")
    if kind == "array" and extra == {"type"}:
        return json_value_regex(FREE_FORM_DEPTH, "array")
    if not extra:
        return json_value_regex(FREE_FORM_DEPTH)
    return None


def _object_regex(
    props: dict[str, Any], required: list[str], what: str, defs: dict[str, Any]
) -> str | None:
    r"""The regex of an object with these properties, or None to leave it to Outlines.

    Built here rather than by Outlines for two reasons. Outlines writes an object whose
    properties are all optional as one alternative per possible first property, each
    repeating every property after it: quadratic, and multiplied at every level of nesting
    (real-world schemas reached 100,000s of characters). Here, with P_k the k-th
    ``"name":value`` and Q_k any non-empty ordered subset of P_k..P_n: ``Q_n = P_n``,
    ``Q_k = (P_k,)?(Q_{k+1})|P_k``; the object is ``\{(Q_1)?\}``: the same language
    (properties in schema order, none repeated), each P_k written twice. And Outlines
    writes property names into the regex without JSON-escaping them (``say "hi"``).
    With required properties the form is Outlines': ``(P,)?`` for optional properties
    before the last required one, ``(,P)?`` after it. A required name that has no
    ``properties`` entry is added, with any value.
    """
    props = {**props, **{n: True for n in required if isinstance(n, str) and n not in props}}
    parts: dict[str, str] = {}
    for name, sub in props.items():
        if sub is False:
            if name in required:
                raise InvalidRequest(
                    f"{what} requires property {name!r} but forbids it",
                    param=what,
                    code="invalid_schema",
                )
            continue
        if sub is True:  # ({} was already rewritten, like every subschema, before its object)
            value = json_value_regex(FREE_FORM_DEPTH)
        elif isinstance(sub, dict):
            try:
                value = _outlines_regex({**sub, **defs} if defs else sub, what)
            except InvalidRequest:
                return None  # e.g. a $ref into the enclosing schema: Outlines resolves it
        else:
            return None
        key = regex_literal(json.dumps(name, ensure_ascii=False))
        parts[name] = f"{key}:{value}"
    if not parts:
        return r"\{\}"
    pieces = list(parts.values())
    if not required:
        q = pieces[-1]
        for p in reversed(pieces[:-1]):
            q = f"({p},)?({q})|{p}"  # one level of nesting per property
        return rf"\{{({q})?\}}"
    last = max(i for i, name in enumerate(parts) if name in required)
    out = []
    for i, (name, p) in enumerate(parts.items()):
        p = f"{p}," if i < last else (f",{p}" if i > last else p)
        out.append(p if name in required else f"({p})?")
    return r"\{" + "".join(out) + r"\}"


def _relax_sizes(node: dict[str, Any], max_counted: int) -> bool:
    """Drop counted repetition the automaton cannot afford. Returns False if anything went.

    Outlines compiles the regex into an automaton whose every state is walked against the
    whole vocabulary (~150k tokens for Qwen): ``maxLength: 1024`` alone is 1024 states, and
    real-world schemas carry dozens of such bounds (vLLM ran out of 24 GiB on one). Bounds
    above `max_counted` are therefore left to the final jsonschema check.
    """
    exact = True
    items = node.get("items")
    # Counted arrays of objects repeat the whole object automaton: keep them uncounted.
    item_limit = 1 if isinstance(items, dict) and not _is_scalar(items) else max_counted
    limits = {"minLength": max_counted, "maxLength": max_counted}
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
        relaxed = _COUNTED.sub(lambda m: _uncount(m, max_counted), pattern)
        if relaxed != pattern:
            exact = False
        node["pattern"], safe_exact = json_safe_pattern(relaxed)
        exact &= safe_exact
    return exact


def _is_scalar(schema: dict[str, Any]) -> bool:
    return schema.get("type") in ("string", "integer", "number", "boolean", "null") and not (
        {"anyOf", "oneOf", "allOf", "$ref"} & schema.keys()
    )


_COUNTED = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def _uncount(m: re.Match[str], max_counted: int) -> str:
    low = int(m.group(1))
    high = m.group(2)
    top = low if high is None else (int(high) if high else None)
    if top is not None and top <= max_counted:
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


# --------------------------------------------------------------------------- tool envelope
def name_regex(names: list[str]) -> str:
    """Stage 1 of a call: the head, with the name chosen among `names`."""
    choice = "|".join(regex_literal(n) for n in names)
    before, after = call_head("\0").split('"\\u0000"')  # the envelope, around the name
    return regex_literal(before + '"') + f"({choice})" + regex_literal('"' + after)


def arguments_regex(schema: CompiledSchema, *, parallel: bool) -> str:
    """Stage 2 of a call: its arguments and the closing brace, optionally ``\\n</tool_call>``;
    with `parallel`, then optionally the opening of another call (``\\n<tool_call>\\n``),
    after which the caller continues from stage 1.

    Splitting the call in two keeps every automaton the size of one schema, and lets vLLM's
    cache reuse a tool's automaton whatever other tools come with it: a union of several
    real-world schemas took minutes to compile, or exhausted memory.
    """
    close = regex_literal(TOOL_CALL_CLOSE).replace("\n", r"\n")
    after = regex_literal(CALL_SEPARATOR[len(TOOL_CALL_CLOSE) :]).replace("\n", r"\n")
    tail = f"({close}({after})?)?" if parallel else f"({close})?"
    return f"({schema.regex})" + r"\}" + tail


def tool_call_regex(tools: dict[str, CompiledSchema], *, parallel: bool) -> str:
    """The whole language of one call (stage 1 then 2), for documentation and tests."""
    alternatives = [
        regex_literal(call_head(name)) + arguments_regex(c, parallel=parallel)
        for name, c in tools.items()
    ]
    return "(" + "|".join(f"({a})" for a in alternatives) + ")"
