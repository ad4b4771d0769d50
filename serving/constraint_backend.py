"""The constraint backend seam: how a model turn that may call tools is constrained.

`LOOPSTACK_CONSTRAINT_BACKEND` picks one; the engine is started with the matching vLLM
structured-output backend (``--structured-outputs-config.backend``), since vLLM fixes it per
engine.

* ``guidance`` (llguidance, the default) and ``xgrammar`` - **one engine request per turn**:
  the whole turn (free text in ``auto``, then one or more calls, each under its own tool's
  argument schema) is one constraint (`serving.backend_xgrammar`, `serving.backend_guidance`);
  the turn is read back by `serving.turn`.
* ``outlines`` - the older path (`serving.backend_outlines`): regexes built with outlines_core,
  a call in two requests (head, then arguments), ``auto`` by watching free text.

Every grammar backend compiles a turn's constraint **itself first**, in a worker process with
a deadline and a memory ceiling (`serving.grammar_checker`), with the engine's own library and the
model's vocabulary: vLLM has no timeout on compiling JSON-schema or structural-tag grammars,
so a pathological one must never reach it. Verdicts are cached (agents resend the same tools
every step). Whatever a backend does not enforce exactly is still validated with jsonschema
before a call leaves the server (`exact`), and features no backend enforces and no
generation is likely to meet by chance (lookaround, backreferences in ``pattern``) are
refused at admission (`refuse_unenforceable`).
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from serving.exceptions import InvalidRequest

logger = logging.getLogger(__name__)

BackendName = Literal["xgrammar", "guidance", "outlines"]
ToolMode = Literal["required", "named", "auto"]
DEFAULT_BACKEND: BackendName = "guidance"
# Keywords no backend enforces token by token (or enforces only in part): their output is
# validated before it leaves, so it is never streamed as generated.
INEXACT_KEYWORDS = frozenset(
    {"multipleOf", "uniqueItems", "not", "if", "then", "else", "contains", "minContains",
     "maxContains", "patternProperties", "propertyNames", "dependentRequired",
     "dependentSchemas", "dependencies", "minProperties", "maxProperties",
     "unevaluatedProperties", "unevaluatedItems", "oneOf", "allOf", "format", "pattern",
     "$ref", "$dynamicRef", "exclusiveMinimum", "exclusiveMaximum"}
)  # fmt: skip
_NAMED_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions")
_LOOKAROUND = re.compile(r"\(\?<?[=!]")
_BACKREF = re.compile(r"(?<!\\)(?:\\\\)*\\(?:[1-9]|k<)")


@dataclass(frozen=True)
class TurnSpec:
    """What one turn's constraint must allow: calls of these tools (name -> parameters)."""

    mode: ToolMode
    tools: dict[str, Any]
    parallel: bool

    def key(self) -> str:
        return json.dumps([self.mode, self.parallel, self.tools], sort_keys=True, default=str)


class Checker(Protocol):
    """Compiles a grammar backend's payload first, bounded (`serving.grammar_checker`)."""

    async def check(self, payload: str, *, what: str) -> None: ...
    def warm(self) -> None: ...
    def close(self) -> None: ...


class ConstraintBackend(Protocol):
    name: BackendName
    single_request: bool  # False: the two-stage outlines path in `serving.chat`

    def exact(self, schema: Any) -> bool: ...
    async def admit(self, spec: TurnSpec, *, what: str) -> dict[str, Any]: ...
    def warm(self) -> None: ...
    def close(self) -> None: ...


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every subschema (dict) in `node`, iteratively (depth is bounded before this runs)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            yield cur
            stack.extend(v for k, v in cur.items() if k not in ("enum", "const", "default"))
        elif isinstance(cur, list):
            stack.extend(cur)


def exact_for_grammar(schema: Any) -> bool:
    """Whether a grammar backend enforces `schema` exactly (conservatively)."""
    return not any(INEXACT_KEYWORDS & node.keys() for node in walk(schema))


_LITERAL_KEYS = ("enum", "const", "default", "examples")  # values, not subschemas


def map_schema(node: Any, visit: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of a JSON Schema with `visit(original, copy)` applied to every subschema, inner
    ones first. Literal values (``enum``, ``const``, ...) are kept as they are, and the maps of
    named subschemas (``properties``, ``$defs``, ...) are walked by value, never visited as
    schemas themselves (a property may be named ``type`` or ``enum``)."""
    if isinstance(node, list):
        return [map_schema(v, visit) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in _LITERAL_KEYS:
            out[k] = v
        elif k in _NAMED_SUBSCHEMAS and isinstance(v, dict):
            out[k] = {n: map_schema(x, visit) for n, x in v.items()}
        else:
            out[k] = map_schema(v, visit)
    return visit(node, out)


def _valid_regex(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def without_patterns(spec: TurnSpec) -> TurnSpec | None:
    """`spec` with every valid ``pattern`` left out of the constraint (``pattern`` is inexact:
    a call is validated against the client's schema before it leaves), or None if none."""

    def drop(node: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        # an invalid pattern stays: its refusal is the answer
        return {k: v for k, v in out.items()
                if not (k == "pattern" and isinstance(v, str) and _valid_regex(v))}  # fmt: skip

    tools = {name: map_schema(schema, drop) for name, schema in spec.tools.items()}
    return TurnSpec(spec.mode, tools, spec.parallel) if tools != spec.tools else None


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


class GrammarBackend:
    """What the xgrammar and guidance backends share: admission with a verdict cache."""

    name: BackendName
    single_request = True

    def __init__(self, checker: Checker, *, cache_size: int = 512) -> None:
        self.checker = checker
        self._verdicts: OrderedDict[str, dict[str, Any] | InvalidRequest] = OrderedDict()
        self._size = cache_size

    def build(self, spec: TurnSpec) -> tuple[dict[str, Any], str]:
        """The request's ``structured_outputs`` and the payload the checker compiles."""
        raise NotImplementedError

    def exact(self, schema: Any) -> bool:
        return exact_for_grammar(schema)

    async def admit(self, spec: TurnSpec, *, what: str) -> dict[str, Any]:
        key = spec.key()
        hit = self._verdicts.get(key)
        if hit is None:
            hit = await self._compiled(spec, what=what)
            relaxed = without_patterns(spec)
            if isinstance(hit, InvalidRequest) and hit.code == "invalid_schema" and relaxed:
                # a pattern the engine's library cannot compile (anchors inside alternations,
                # a pattern with length bounds): enforce the rest, validate the pattern after
                retry = await self._compiled(relaxed, what=what)
                hit = retry if not isinstance(retry, InvalidRequest) else hit
            self._verdicts[key] = hit
            while len(self._verdicts) > self._size:
                self._verdicts.popitem(last=False)
        self._verdicts.move_to_end(key)
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message, param=hit.param, code=hit.code)
        return hit

    async def _compiled(self, spec: TurnSpec, *, what: str) -> dict[str, Any] | InvalidRequest:
        body, payload = self.build(spec)
        try:
            await self.checker.check(payload, what=what)
        except InvalidRequest as exc:
            return exc
        return body

    def warm(self) -> None:
        self.checker.warm()

    def close(self) -> None:
        self.checker.close()
