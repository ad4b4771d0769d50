"""The one schema walker: where a JSON Schema holds subschemas, and what the backends read
off them.

Every part of serving that looks inside a client's schema walks it here: which keywords of a
node hold subschemas (a map of named ones, a single one, a list), which hold literal values
(``enum``, ``const``, ...), and which subschemas are read negated (``not``, ``if``). The map
of ``properties`` is never a schema node itself: a tool with a parameter named ``format``,
``pattern``, ``contains``, ``not`` or ``if`` is a tool with a parameter, not a schema using
that keyword (an earlier walker read the map as a node, so such tools were held back as
inexact instead of streamed).

On top of the walk:

* `INEXACT_KEYWORDS` - the one list of keywords no backend enforces token by token (or only
  in part): a schema using one is validated with jsonschema before its output leaves, never
  streamed as generated. A backend adds what it alone cannot enforce
  (`GRAMMAR_INEXACT` for the grammar backends; `loopstack.serving.constraint.schema_regex` reads
  ``oneOf``/``allOf`` and bounds itself).
* `map_schema` - a copy of a schema with a rewrite applied to every subschema (the grammar
  backends' tightening and relaxing, `without_patterns`).
* `refuse_unenforceable` - 400 for a ``pattern`` no backend can enforce and few generations
  would meet (lookaround, backreferences).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from loopstack.serving.exceptions import InvalidRequest

# Where a node holds subschemas (JSON Schema 2020-12, with the draft-07 spellings).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_SINGLES = (
    "items", "additionalProperties", "additionalItems", "contains", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "then", "else", "not", "if",
)  # fmt: skip
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
NEGATED = frozenset({"not", "if"})  # read as "must not match" / as a condition only
LITERAL_KEYS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas

# Keywords no backend enforces token by token (or enforces only in part): their output is
# validated before it leaves, so it is never streamed as generated.
INEXACT_KEYWORDS = frozenset(
    {"multipleOf", "uniqueItems", "not", "if", "then", "else", "contains", "minContains",
     "maxContains", "patternProperties", "propertyNames", "dependentRequired",
     "dependentSchemas", "dependencies", "minProperties", "maxProperties",
     "unevaluatedProperties", "unevaluatedItems"}
)  # fmt: skip
# What the grammar backends (guidance, xgrammar) enforce only in part besides: composition
# beyond anyOf, string formats and patterns (tightened or left out when the library cannot
# compile them), references, exclusive bounds.
GRAMMAR_INEXACT = INEXACT_KEYWORDS | {
    "oneOf", "allOf", "format", "pattern", "$ref", "$dynamicRef", "exclusiveMinimum",
    "exclusiveMaximum",
}  # fmt: skip

_LOOKAROUND = re.compile(r"\(\?<?[=!]")
_BACKREF = re.compile(r"(?<!\\)(?:\\\\)*\\(?:[1-9]|k<)")


def children(node: Any, *, negated: bool = True) -> Iterator[tuple[str, Any]]:
    """The subschemas `node` holds directly, each with its JSON-pointer step (``/items``,
    ``/properties/city``, ``/anyOf/0``). `negated`: also those under ``not`` and ``if``."""
    if not isinstance(node, dict):
        return
    for key in SCHEMA_MAPS:
        sub = node.get(key)
        if isinstance(sub, dict):
            for name, value in sub.items():
                yield f"/{key}/{name}", value
    for key in SCHEMA_SINGLES:
        if key in node and isinstance(node[key], dict | bool) and (negated or key not in NEGATED):
            yield f"/{key}", node[key]
    for key in SCHEMA_LISTS:
        sub = node.get(key)
        if isinstance(sub, list):
            for i, value in enumerate(sub):
                yield f"/{key}/{i}", value


def walk_paths(schema: Any, *, negated: bool = True) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema of `schema` that is an object, with its path (``""`` for the root),
    iteratively: depth is bounded (`loopstack.serving.constraint.schema_limits`) but never by
    Python's stack."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            yield path, node
            stack.extend((path + step, sub) for step, sub in children(node, negated=negated))


def walk(schema: Any, *, negated: bool = True) -> Iterator[dict[str, Any]]:
    """Every subschema of `schema` that is an object (`walk_paths` without the paths)."""
    return (node for _, node in walk_paths(schema, negated=negated))


def map_schema(node: Any, visit: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of a JSON Schema with `visit(original, copy)` applied to every subschema, inner
    ones first. Only the places `children` names are subschemas: literal values (``enum``,
    ``const``, ...) and everything else are copied as they are, and the maps of named
    subschemas (``properties``, ``$defs``, ...) are walked by value, never visited as schemas
    themselves (a property may be named ``type`` or ``enum``)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {n: map_schema(x, visit) for n, x in v.items()}
        elif k in SCHEMA_SINGLES and isinstance(v, dict):
            out[k] = map_schema(v, visit)
        elif k in SCHEMA_LISTS and isinstance(v, list):
            out[k] = [map_schema(x, visit) for x in v]
        else:
            out[k] = v
    return visit(node, out)


def uses_any(schema: Any, keywords: frozenset[str]) -> bool:
    """Whether any subschema of `schema` uses one of `keywords`."""
    return any(keywords & node.keys() for node in walk(schema))


def exact_for_grammar(schema: Any) -> bool:
    """Whether a grammar backend enforces `schema` exactly (conservatively)."""
    return not uses_any(schema, GRAMMAR_INEXACT)


def _valid_regex(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def drop_patterns(schema: Any) -> Any:
    """`schema` without its valid ``pattern`` keywords (an invalid one stays: its refusal is
    the answer). A property named ``pattern`` is a property, and stays."""

    def drop(node: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in out.items()
                if not (k == "pattern" and isinstance(v, str) and _valid_regex(v))}  # fmt: skip

    return map_schema(schema, drop)


def refuse_unenforceable(schema: Any, *, what: str) -> None:
    """400 for a ``pattern`` no constraint can enforce and few generations would meet."""
    for node in walk(schema):
        patterns = [node.get("pattern")]
        if isinstance(node.get("patternProperties"), dict):
            patterns += list(node["patternProperties"])
        for pattern in patterns:
            if not isinstance(pattern, str):
                continue
            if _LOOKAROUND.search(pattern):
                feature = "lookaround ((?=...), (?!...), (?<=...), (?<!...))"
            elif _BACKREF.search(pattern):
                feature = "a backreference (\\1, \\k<name>)"
            else:
                continue
            raise InvalidRequest(
                f"{what} has a pattern that uses {feature}, which constrained decoding cannot "
                f"enforce: {pattern[:80]!r}. Rewrite the pattern without it.",
                param=what,
                code="unsupported_schema",
            )
