"""One admission path for the constraints clients write themselves.

vLLM accepts decoding constraints in several spellings - ``structured_outputs`` (``regex``,
``json``, ``choice``, ``grammar``, ``json_object``, ``structural_tag``), the older
``guided_regex`` / ``guided_json`` / ``guided_choice`` / ``guided_grammar`` and
``response_format`` - and compiles each on a thread that outlives its timeout: one
``(a|b)*a(a|b){19}`` held a core for 15 minutes. `admit_constraints` is the only way any of
them reaches the engine, through the configured constraint backend (`ConstraintBackend.client`),
which compiles it first in its sandbox, as it does a turn's constraint:

* a JSON schema is admitted like a tool's (limits, satisfiability) and becomes the backend's
  own constraint: under ``guidance`` (the default) an llguidance grammar, under ``xgrammar``
  a structural tag - no regex is made - and under ``outlines`` our measured regex;
* a regex goes to the engine as it is, once the backend's library compiled it (outlines:
  its automaton measured);
* a choice becomes the regex of its escaped alternatives;
* ``json_object`` (a fixed grammar) passes;
* a grammar, a structural tag, a whitespace pattern or a backend choice is refused (400
  ``unsupported_constraint``): its compile cost cannot be measured before vLLM pays it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from loopstack.serving.constraint.patterns import regex_literal, require_regex_text
from loopstack.serving.constraint.schemas import CompiledSchema
from loopstack.serving.exceptions import InvalidRequest

ClientKind = Literal["json", "regex"]  # a client's choice list arrives as its regex


@dataclass(frozen=True)
class ClientRule:
    """A client constraint as the engine will get it, and the schema its output must meet
    (a JSON schema's; None for a regex)."""

    structured_outputs: dict[str, Any]
    schema: CompiledSchema | None = None


class ClientAdmitter(Protocol):
    """The part of a constraint backend this module needs: a client constraint admitted."""

    async def client(self, kind: ClientKind, value: Any, *, what: str) -> ClientRule: ...


LEGACY = ("guided_regex", "guided_json", "guided_choice", "guided_grammar")
REFUSED_TOP = ("guided_whitespace_pattern", "guided_decoding_backend", "structural_tag")
_KINDS = ("regex", "json", "choice", "grammar", "json_object", "structural_tag")
_FLAGS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")
MAX_CHOICES = 256
# Every field that can carry a constraint (the tool path refuses them all: it constrains).
CONSTRAINT_FIELDS = ("structured_outputs", *LEGACY, *REFUSED_TOP)


@dataclass
class Admitted:
    """The request body to send, and the schema its output must satisfy (if any)."""

    body: dict[str, Any]
    schema: CompiledSchema | None = None


def _unsupported(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param}: {why} Use a regex, a JSON schema or a list of choices: their cost is "
        "measured before the engine compiles them.",
        param=param,
        code="unsupported_constraint",
    )


def client_constraint(body: dict[str, Any]) -> tuple[str, str, Any] | None:
    """(param, kind, value) of the one constraint in `body`, None if there is none."""
    found: list[tuple[str, str, Any]] = []
    for key in REFUSED_TOP:
        if body.get(key) is not None:
            raise _unsupported(key, "this field is not accepted.")
    for key in LEGACY:
        if body.get(key) is not None:
            found.append((key, key.removeprefix("guided_"), body[key]))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequest("structured_outputs must be an object", param="structured_outputs")
        unknown = so.keys() - set(_KINDS) - set(_FLAGS)
        if unknown:
            raise _unsupported(
                f"structured_outputs.{sorted(unknown)[0]}", "this option is not accepted."
            )
        for kind in _KINDS:
            if so.get(kind) not in (None, False):
                found.append((f"structured_outputs.{kind}", kind, so[kind]))
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            found.append(("response_format.json_schema", "json", js.get("schema")))
        elif rf.get("type") == "json_object":
            found.append(("response_format", "json_object", True))
        else:
            raise _unsupported("response_format", f"type {str(rf.get('type'))[:40]!r}.")
    if len(found) > 1:
        raise InvalidRequest(
            f"only one constraint per request: {found[0][0]} and {found[1][0]} were both given",
            param=found[1][0],
        )
    return found[0] if found else None


def choice_regex(choices: Any, param: str) -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise InvalidRequest(f"{param} must be a non-empty list of strings", param=param)
    if len(choices) > MAX_CHOICES:
        raise InvalidRequest(
            f"{param} has {len(choices)} choices (limit {MAX_CHOICES})",
            param=param,
            code="schema_too_complex",
        )
    return "(" + "|".join(regex_literal(c) for c in choices) + ")"


async def admit_constraints(
    body: dict[str, Any], backend: ClientAdmitter, *, constrained: bool = True
) -> Admitted:
    """Check the client's constraint in `body` (a chat or completions request body) and
    return the body to send: the constraint as the backend enforces it (or ``json_object``),
    none when unconstrained. Raises InvalidRequest (400) for what cannot be admitted."""
    found = client_constraint(body)
    if found is None:
        return Admitted(body)
    param, kind, value = found
    out = {k: v for k, v in body.items() if k not in (*CONSTRAINT_FIELDS, "response_format")}
    if isinstance(body.get("structured_outputs"), dict):  # keep vLLM's harmless flags
        flags = {k: v for k, v in body["structured_outputs"].items() if k in _FLAGS}
    else:
        flags = {}
    if kind in ("grammar", "structural_tag"):
        raise _unsupported(param, f"{kind} constraints are not accepted.")
    if kind == "json_object":
        if param == "response_format":
            out["response_format"] = body["response_format"]
            return Admitted(out)
        so: dict[str, Any] = {"json_object": True}
        schema: CompiledSchema | None = None
    elif kind == "json":
        rule = await backend.client("json", value, what=param)
        so, schema = rule.structured_outputs, rule.schema
    else:
        regex = require_regex_text(choice_regex(value, param) if kind == "choice" else value, param)
        so, schema = (await backend.client("regex", regex, what=param)).structured_outputs, None
    if constrained:
        out["structured_outputs"] = {**flags, **so}
    return Admitted(out, schema)
