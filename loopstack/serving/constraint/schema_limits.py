"""Cheap checks on a client's JSON Schema, before anything expands or recurses over it.

`check_schema_limits` walks the schema once, iteratively (no Python recursion, so a schema
nested thousands of levels deep is refused rather than raising RecursionError), and refuses
with 400:

* ``schema_too_complex`` - more than `SchemaLimits.max_depth` levels of nesting, more than
  `max_nodes` JSON values, ``$ref`` chains longer than `max_ref_chain`, or a ``$ref`` that
  is not local (``#...``: nothing is fetched);
* ``invalid_schema`` - numbers no regex or validator can honour (NaN, infinities, a lower
  bound above ``10**20`` or an upper bound below ``-10**20``), and subschemas no value can
  satisfy: an empty ``enum``, an ``enum``/``const`` with no value of the declared type,
  ``minimum`` above ``maximum`` (exclusive bounds included), ``minLength`` above
  ``maxLength``, ``minItems`` above ``maxItems``, ``minProperties`` above
  ``maxProperties``. Those under ``not``/``if`` are left alone (there they mean "always").

Permissive enormous bounds (``maximum: 1.8e308``, common for doubles) are fine: the regex
leaves that side open (`constraint/schema_regex.py`) and the final validation still
checks it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from loopstack.serving.config import setting_default
from loopstack.serving.constraint.walker import walk, walk_paths
from loopstack.serving.exceptions import InvalidRequest

HUGE_BOUND = 10**20  # beyond int64: a bound past it is left to validation, or refused


# The setting each limit is read from (`LOOPSTACK_MAX_SCHEMA_*`, defaults declared there).
SETTINGS = {"max_depth": "max_schema_depth", "max_nodes": "max_schema_nodes",
            "max_ref_chain": "max_schema_ref_chain"}  # fmt: skip


@dataclass(frozen=True)
class SchemaLimits:
    # JSON nesting levels (a property's schema is 2 below its object)
    max_depth: int = setting_default(SETTINGS["max_depth"])
    max_nodes: int = setting_default(SETTINGS["max_nodes"])
    max_ref_chain: int = setting_default(SETTINGS["max_ref_chain"])


_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "number": lambda v: _is_num(v),
    "integer": lambda v: _is_num(v) and float(v).is_integer(),
}


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def fits_type(value: Any, kind: Any) -> bool:
    """Whether `value` is of the JSON Schema `type` (a name or a list of names)."""
    kinds = kind if isinstance(kind, list) else [kind]
    try:
        return any(k in _TYPES and _TYPES[k](value) for k in kinds)
    except OverflowError:  # float() of an enormous integer: it is an integer
        return isinstance(value, int) and bool({"integer", "number"} & set(kinds))


def check_schema_limits(schema: Any, *, what: str, limits: SchemaLimits | None = None) -> None:
    """Raise InvalidRequest (400) if `schema` is too big, too deep or unsatisfiable."""
    limits = limits or SchemaLimits()
    _check_shape(schema, what, limits)
    if isinstance(schema, dict):
        _check_refs(schema, what, limits)
        _check_semantics(schema, what)


def _too_complex(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{what} is too complex: {why}", param=what, code="schema_too_complex")


def _invalid(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{what} is unsatisfiable or invalid: {why}", param=what,
                          code="invalid_schema")  # fmt: skip


def _check_shape(schema: Any, what: str, limits: SchemaLimits) -> None:
    stack: list[tuple[Any, int]] = [(schema, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _too_complex(what, f"more than {limits.max_nodes:,} values")
        if depth > limits.max_depth:
            raise _too_complex(what, f"nested more than {limits.max_depth} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise _invalid(what, f"it holds the non-finite number {node}")


def _pointer(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref[1:].lstrip("/").split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _check_refs(schema: dict[str, Any], what: str, limits: SchemaLimits) -> None:
    """Local refs only; chains of refs-to-refs bounded (cycles of pure refs refused)."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        stack.extend(node.values())
        ref = node.get("$ref")
        if ref is None:
            continue
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _invalid(what, f"$ref {str(ref)[:100]!r} is not local ('#/...')")
        hops, target = 0, node
        while isinstance(target, dict) and isinstance(target.get("$ref"), str):
            hops += 1
            if hops > limits.max_ref_chain:
                raise _too_complex(what, f"a $ref chain longer than {limits.max_ref_chain}")
            target = _pointer(schema, target["$ref"])


def _check_semantics(schema: dict[str, Any], what: str) -> None:
    for node in walk(schema, negated=False):  # under not/if a contradiction means "always"
        _check_node(node, what)


def _num(node: dict[str, Any], key: str) -> Any:
    v = node.get(key)
    return v if _is_num(v) else None


def _check_node(node: dict[str, Any], what: str) -> None:
    kind = node.get("type")
    typed = isinstance(kind, str | list)
    if "enum" in node and isinstance(node["enum"], list):
        if not node["enum"]:
            raise _invalid(what, "an empty enum admits no value")
        if typed and not any(fits_type(v, kind) for v in node["enum"]):
            raise _invalid(what, f"no value of enum {str(node['enum'])[:100]} is of type {kind}")
    if "const" in node and typed and not fits_type(node["const"], kind):
        raise _invalid(what, f"const {str(node['const'])[:100]} is not of type {kind}")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    numeric_only = typed and kinds <= {"integer", "number"}
    for key in _BOUND_KEYS:
        v = _num(node, key)
        if v is None:
            continue
        restrictive = (key in ("minimum", "exclusiveMinimum") and v > HUGE_BOUND) or (
            key in ("maximum", "exclusiveMaximum") and v < -HUGE_BOUND
        )
        if restrictive and numeric_only:
            raise _invalid(what, f"{key} {v} is beyond what can be generated (|x| <= 1e20)")
    if numeric_only and _numeric_range_empty(node, integer=kinds == {"integer"}):
        raise _invalid(what, f"its numeric bounds admit no value: {_bounds_text(node)}")
    for lo, hi, kind_needed in (
        ("minLength", "maxLength", "string"),
        ("minItems", "maxItems", "array"),
        ("minProperties", "maxProperties", "object"),
    ):
        a, b = _num(node, lo), _num(node, hi)
        if a is not None and b is not None and a > b and kinds == {kind_needed}:
            raise _invalid(what, f"{lo} {a} is above {hi} {b}")


def _bounds_text(node: dict[str, Any]) -> str:
    return ", ".join(f"{k}={node[k]}" for k in _BOUND_KEYS[:4] if k in node)


def _numeric_range_empty(node: dict[str, Any], *, integer: bool) -> bool:
    lo_pairs = ((_num(node, "minimum"), False), (_num(node, "exclusiveMinimum"), True))
    hi_pairs = ((_num(node, "maximum"), False), (_num(node, "exclusiveMaximum"), True))
    lows = [(v, ex) for v, ex in lo_pairs if v is not None]
    highs = [(v, ex) for v, ex in hi_pairs if v is not None]
    if not lows or not highs:
        return False
    lo, lo_ex = max(lows, key=lambda t: (t[0], t[1]))
    hi, hi_ex = min(highs, key=lambda t: (t[0], not t[1]))
    if lo > hi or (lo == hi and (lo_ex or hi_ex)):
        return True
    if not integer:
        return False
    if abs(lo) > HUGE_BOUND or abs(hi) > HUGE_BOUND:
        return False  # an open side: some integer lies inside
    first = math.floor(lo) + 1 if lo_ex or lo != math.floor(lo) else int(lo)
    last = math.ceil(hi) - 1 if hi_ex or hi != math.ceil(hi) else int(hi)
    return first > last


# --- repair of what has one reading --------------------------------------------------------


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    for name in ("string", "number", "array", "object", "null"):
        if _TYPES[name](value):
            return name
    return "string"


def repair_schema(schema: Any) -> tuple[Any, list[str]]:
    """`schema` with self-contradictions that have one reading repaired, and what was done.

    Published tool sets declare ``"type": "boolean"`` with ``"enum": ["True", "False",
    "dontcare"]``, or a string enum under ``"type": "integer"``: no value is of the type, so
    the subschema admits nothing, yet the OpenAI API and vLLM take such tools. The values
    are what the author listed, so **the enum (or const) wins over a type none of its values
    fit**: ``type`` becomes the types of the values. Anything else is left to
    `check_schema_limits` (an empty enum has no reading: 400). The schema is copied only when
    something changes; the repaired one is what is constrained and validated."""
    if not isinstance(schema, dict) or not _repair_walk(schema, fix=False):
        return schema, []  # the common case: nothing copied
    out = copy.deepcopy(schema)
    return out, sorted(_repair_walk(out, fix=True))


def _repair_walk(schema: dict[str, Any], *, fix: bool) -> list[str]:
    """What `repair_schema` repairs in `schema` (in place when `fix`)."""
    notes: list[str] = []
    for path, node in walk_paths(schema, negated=False):
        kind = node.get("type")
        values = node.get("enum") if isinstance(node.get("enum"), list) else None
        if values is None and "const" in node:
            values = [node["const"]]
        if values and isinstance(kind, str | list) and not any(fits_type(v, kind) for v in values):
            types = sorted({_type_of(v) for v in values})
            new = types[0] if len(types) == 1 else types
            notes.append(f"{path or '/'}: type {kind} -> {new} (its enum's values)")
            if fix:
                node["type"] = new
    return notes
