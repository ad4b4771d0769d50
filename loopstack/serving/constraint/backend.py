"""The constraint backend: the one seam between a request and how its output is constrained.

`LOOPSTACK_CONSTRAINT_BACKEND` picks one (`loopstack.serving.constraint.factory`); the engine is
started with the matching vLLM structured-output backend (``--structured-outputs-config.backend``),
since vLLM fixes it per engine. A backend owns everything constraint-shaped in a request:

* `resolve` - **the one entry**: a chat request (`loopstack.serving.constraint.resolve.TurnRequest`)
  and the transport to the engine in, the reply out as events - admission, schema repair,
  ``no_repeat``, planning, the turn's constraint compiled first (a 400 before any reply is
  sent), the turn and its one regenerate loop (`loopstack.serving.constraint.resolve` has the shared
  steps);
* `tool_schema` - a tool's parameters admitted (checked, refused, compiled as the backend
  needs; whether it enforces them exactly);
* `client` - a client's own constraint (``response_format``, ``structured_outputs``,
  ``guided_*``) in the backend's own terms (`client_constraints`).

The backends:

* ``guidance`` (llguidance, the default) and ``xgrammar`` - `GrammarBackend`s: the whole
  turn (free text in ``auto``, then one or more calls, each under its own tool's argument
  schema) is **one engine request** under one grammar (`guidance`, `xgrammar`), and a
  client's JSON schema becomes the same kind of grammar - no regex is made. Every grammar
  is compiled by us first, with the engine's own library and the model's vocabulary, in
  the sandbox (`loopstack.serving.constraint.sandbox`): vLLM has no timeout on compiling JSON-schema
  or structural-tag grammars, so a pathological one must never reach it.
* ``outlines`` - the older path (`loopstack.serving.constraint.outlines`): regexes built with
  outlines_core, a call in two requests (head, then arguments), ``auto`` by watching text.

Whatever a backend does not enforce exactly is still validated with jsonschema before a
call leaves the server, and features no backend enforces and no generation is likely to
meet by chance (lookaround, backreferences in ``pattern``) are refused at admission
(`walker.refuse_unenforceable`). Every verdict is kept in the one `SchemaCache`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loopstack.serving.config import BackendName
from loopstack.serving.constraint.client_constraints import ClientKind, ClientRule
from loopstack.serving.constraint.decision import hide_decision
from loopstack.serving.constraint.no_repeat import without_answered
from loopstack.serving.constraint.resolve import Backend, TurnRequest, admit, pass_through
from loopstack.serving.constraint.sandbox import CompilePool
from loopstack.serving.constraint.schemas import CompiledSchema, SchemaCache, schema_key
from loopstack.serving.constraint.turn import Event, Ready, ToolMode, ToolPlan, grammar_turn
from loopstack.serving.constraint.walker import (
    drop_patterns,
    exact_for_grammar,
    refuse_unenforceable,
)
from loopstack.serving.engine.transport import Transport
from loopstack.serving.exceptions import InvalidRequest, constrained_generation

logger = logging.getLogger(__name__)

# What a grammar backend's sandbox compiles: (format, text), e.g. ("grammar", <lark>).
Payload = tuple[str, str]


@dataclass(frozen=True)
class TurnSpec:
    """What one turn's constraint must allow: calls of these tools (name -> parameters)."""

    mode: ToolMode
    tools: dict[str, Any]
    parallel: bool
    decide: bool = False  # auto: a decision line first (loopstack.serving.selection.defaults)
    # auto: the client's ``response_format`` schema - the answer, when there is no call, is
    # one JSON value under it instead of free text (None: free text)
    answer: Any = None

    def key(self) -> str:
        parts = [self.mode, self.parallel, self.tools] + (["decide"] if self.decide else [])
        if self.answer is not None:
            parts.append({"answer": self.answer})
        return json.dumps(parts, sort_keys=True, default=str)


class ConstraintBackend(Backend, Protocol):
    """What the chat front-end and the shared steps ask of a backend (module docstring): the
    resolving part (`loopstack.serving.constraint.resolve.Backend`), and its lifecycle."""

    def warm(self) -> None: ...
    def close(self) -> None: ...


def without_patterns(spec: TurnSpec) -> TurnSpec | None:
    """`spec` with every valid ``pattern`` left out of the constraint (``pattern`` is inexact:
    a call is validated against the client's schema before it leaves), or None if none."""
    tools = {name: drop_patterns(schema) for name, schema in spec.tools.items()}
    answer = drop_patterns(spec.answer) if spec.answer is not None else None
    if tools == spec.tools and answer == spec.answer:
        return None
    return TurnSpec(spec.mode, tools, spec.parallel, spec.decide, answer)


class GrammarBackend:
    """What the xgrammar and guidance backends share: admission of a grammar compiled first
    in the sandbox (verdicts in the one cache), the one-request turn, client constraints.

    A subclass says how a turn and a client's JSON schema become its grammar (`build`,
    `build_json`) and which sandbox job compiles a payload (`check_job`)."""

    name: BackendName
    check_job: Callable[[Any, str, str], str | None]  # (state, format, text) -> error or None
    # an ``auto`` turn's answer held to a client's ``response_format`` schema (`TurnSpec.answer`)
    answers: bool = False

    def __init__(
        self, pool: CompilePool, *, schemas: SchemaCache | None = None, timeout_s: float = 10.0
    ) -> None:
        self.pool = pool
        self.schemas = schemas or SchemaCache()
        self.timeout_s = timeout_s

    # -- what a subclass says --------------------------------------------------------------
    def build(self, spec: TurnSpec) -> tuple[dict[str, Any], Payload]:
        """A turn's ``structured_outputs`` and the payload the sandbox compiles."""
        raise NotImplementedError

    def build_json(self, schema: Any) -> tuple[dict[str, Any], Payload]:
        """A client's JSON schema as ``structured_outputs``, and its payload."""
        raise NotImplementedError

    def exact(self, schema: Any) -> bool:
        return exact_for_grammar(schema)

    # -- the backend -----------------------------------------------------------------------
    async def tool_schema(self, schema: Any, *, what: str, enforced: bool = True) -> CompiledSchema:
        if not enforced:  # the unconstrained baseline: validated, never enforced
            return await self.schemas.checked(schema, what=what)
        refuse_unenforceable(schema, what=what)
        return await self.schemas.checked(schema, what=what, exact=self.exact)

    async def resolve(self, request: TurnRequest, transport: Transport) -> AsyncIterator[Event]:
        admitted = await admit(self, request)
        for header in admitted.headers:
            yield header
        plan = admitted.plan
        constraint = None if plan is None else await self.admit(plan)
        if plan is None or constraint is None:  # tool_choice "none", or no call left to make
            rest = request if plan is None else request.without_tools()
            async for ev in pass_through(self, rest, transport):
                yield ev
            return
        yield Ready(plan.mode, plan.prompt_tokens)
        turn = grammar_turn(plan, transport, constraint, live=plan.stream)
        if plan.decide:  # the decision line is the grammar's, never the client's
            turn = hide_decision(turn)
        with constrained_generation("the tools' constraint"):
            async for turn_ev in turn:
                yield turn_ev

    async def admit(self, plan: ToolPlan) -> dict[str, Any] | None:
        """The turn's ``structured_outputs``, compiled first; None when
        ``loopstack.no_repeat`` leaves no call to make."""
        schemas = {n: c.schema for n, c in plan.tools.items()}
        if plan.answered:  # loopstack.no_repeat: the grammar admits no answered call again
            schemas = without_answered(schemas, plan.answered, plan.mode)
            if not schemas:
                return None
        auto = plan.mode == "auto"
        answer = plan.answer.schema if plan.answer is not None else None  # auto only (`plan`)
        spec = TurnSpec(plan.mode, schemas, plan.parallel, plan.decide and auto, answer)
        return await self.constraint(spec)

    async def constraint(self, spec: TurnSpec, *, what: str = "tools") -> dict[str, Any]:
        """The ``structured_outputs`` of a turn of `spec`, compiled first (decided once: a
        turn seen before builds nothing)."""

        def relaxed() -> tuple[dict[str, Any], Payload] | None:
            less = without_patterns(spec)
            return None if less is None else self.build(less)

        return await self._admitted("turn:" + spec.key(), what, lambda: self.build(spec), relaxed)

    async def client(self, kind: ClientKind, value: Any, *, what: str) -> ClientRule:
        if kind == "regex":
            body = await self._admitted(
                "regex:" + value, what, lambda: ({"regex": value}, ("regex", value)), None
            )
            return ClientRule(body)
        schema = await self.tool_schema(value, what=what)

        def relaxed() -> tuple[dict[str, Any], Payload] | None:
            less = drop_patterns(value)
            return None if less == value else self.build_json(less)

        body = await self._admitted(
            "json:" + schema_key(value), what, lambda: self.build_json(value), relaxed
        )
        return ClientRule(body, schema)

    def warm(self) -> None:
        self.pool.warm()

    def close(self) -> None:
        self.pool.close()

    # -- compiling first -------------------------------------------------------------------
    async def _admitted(
        self,
        key: str,
        what: str,
        make: Callable[[], tuple[dict[str, Any], Payload]],
        relaxed: Callable[[], tuple[dict[str, Any], Payload] | None] | None,
    ) -> dict[str, Any]:
        """`make()`'s ``structured_outputs`` once its payload compiled in the sandbox (decided
        once per `key`; nothing is built on a cached verdict). A pattern the engine's library
        cannot compile (anchors inside alternations, a pattern with length bounds): the rest is
        enforced (`relaxed()`, None when there is no pattern to leave out), the pattern
        validated after generation."""

        async def decide() -> dict[str, Any]:
            hit = await self._compiled(*make(), what=what)
            if isinstance(hit, InvalidRequest) and hit.code == "invalid_schema" and relaxed:
                less = relaxed()
                retry = await self._compiled(*less, what=what) if less is not None else hit
                hit = retry if not isinstance(retry, InvalidRequest) else hit
            if isinstance(hit, InvalidRequest):
                raise hit
            return hit

        return await self.schemas.verdict(key, what, decide, timed=True)

    async def _compiled(
        self, body: dict[str, Any], payload: Payload, *, what: str
    ) -> dict[str, Any] | InvalidRequest:
        try:
            error = await self.pool.run(self.check_job, *payload, what=what,
                                        timeout_s=self.timeout_s)  # fmt: skip
        except InvalidRequest as exc:  # over the deadline or the memory ceiling
            return exc
        if error is not None:
            return InvalidRequest(
                f"{what} cannot be enforced by the {self.name} backend: {error[:300]}",
                param=what,
                code="invalid_schema",
            )
        return body
