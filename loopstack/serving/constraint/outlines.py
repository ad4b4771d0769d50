"""The ``outlines`` constraint backend: regexes, one call in two engine requests.

vLLM's outlines backend enforces regexes (no structural tags), indexing every automaton state
against the whole vocabulary when it first meets a regex (~3 ms per state here), so
`loopstack.serving.constraint.schema_regex` builds compact regexes from outlines_core and
`loopstack.serving.constraint.regexes` measures their automata first, in the sandbox. A call is
generated in two stages so that each automaton is the size of one schema:

* ``required`` / named - the prompt ends with ``<tool_call>\\n``; the call's head (which tool,
  `schema_regex.name_regex`; skipped when only one is offered), then that tool's arguments
  (`schema_regex.arguments_regex`), which may end by opening another call (parallel calls).
* ``auto`` - a *lazy constraint*: the model writes freely; `calltext.CallReader.intent` watches
  for the start of a call (``<tool_call>``, a ```json fence, a bare ``{"name": ...}``). Then
  the free stream is dropped (vLLM aborts it) and the call is generated again under the
  regexes from the text before it, which the prefix cache makes cheap.

A client's JSON schema or regex becomes one measured regex too (`client`). The regex
pipeline lives here alone: the grammar backends make none. ``loopstack.no_repeat`` is not
enforced on this path (README).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from loopstack.serving.constraint.backend import BackendName
from loopstack.serving.constraint.calltext import CallEvent, CallReader, ParsedCall
from loopstack.serving.constraint.client_constraints import ClientKind, ClientRule
from loopstack.serving.constraint.envelope import CALL_SEPARATOR, TOOL_CALL_OPEN, call_head
from loopstack.serving.constraint.regexes import RegexSchemas
from loopstack.serving.constraint.resolve import TurnRequest, admit, pass_through
from loopstack.serving.constraint.schema_regex import arguments_regex, name_regex
from loopstack.serving.constraint.schemas import CompiledSchema
from loopstack.serving.constraint.turn import (
    REGENERATE,
    AutoSwitch,
    Done,
    Event,
    Ready,
    Retry,
    Tally,
    ToolPlan,
    TurnEvent,
    generate,
    regenerating,
)
from loopstack.serving.constraint.walker import refuse_unenforceable
from loopstack.serving.engine.transport import Transport
from loopstack.serving.exceptions import ToolCallValidationError, constrained_generation

logger = logging.getLogger(__name__)

MAX_CALLS_PER_TURN = 16
_HEAD_NAME = re.compile(r'\{"name": "([^"]*)", "arguments": $')
# What an engine failure under a regex most often means, and what the client can do.
_ENGINE_HINT = (
    " - most often because compiling the schema's automaton took longer than "
    "LOOPSTACK_REGEX_COMPILE_TIMEOUT_S; a simpler schema (fewer optional nested fields) "
    "avoids it"
)


@dataclass(frozen=True)
class Regexes:
    """One request's regexes: the head (which tool), and each tool's arguments."""

    name: str
    arguments: dict[str, str]


class OutlinesBackend:
    name: BackendName = "outlines"

    def __init__(self, regexes: RegexSchemas | None = None) -> None:
        self.regexes = regexes or RegexSchemas()
        self.schemas = self.regexes.cache

    async def tool_schema(self, schema: Any, *, what: str, enforced: bool = True) -> CompiledSchema:
        if not enforced:  # the unconstrained baseline: validated, never enforced
            return await self.schemas.checked(schema, what=what)
        refuse_unenforceable(schema, what=what)
        return await self.regexes.get(schema, what=what)

    async def resolve(self, request: TurnRequest, transport: Transport) -> AsyncIterator[Event]:
        admitted = await admit(self, request)
        for header in admitted.headers:
            yield header
        plan = admitted.plan
        if plan is None:  # tool_choice "none" (no_repeat is not enforced on this path)
            async for ev in pass_through(self, request, transport):
                yield ev
            return
        regexes = self.admit(plan)
        yield Ready(plan.mode, plan.prompt_tokens)
        async for turn_ev in self.turn(plan, transport, regexes):
            yield turn_ev

    def admit(self, plan: ToolPlan) -> Regexes:
        return Regexes(
            name_regex(list(plan.tools)),
            {n: arguments_regex(c, parallel=plan.parallel) for n, c in plan.tools.items()},
        )

    async def client(self, kind: ClientKind, value: Any, *, what: str) -> ClientRule:
        if kind == "json":
            compiled = await self.regexes.get(value, what=what)
            return ClientRule({"regex": compiled.regex}, compiled)
        await self.regexes.check_regex(value, what=what)
        return ClientRule({"regex": value})

    def warm(self) -> None:
        self.regexes.compiler.pool.warm()

    def close(self) -> None:
        self.regexes.close()

    async def turn(
        self, plan: ToolPlan, transport: Transport, regexes: Regexes
    ) -> AsyncIterator[TurnEvent]:
        """A constrained turn: free text in ``auto`` until a call starts, then the calls."""
        tally = Tally()
        prompt = plan.prompt
        if plan.mode == "auto":
            reader = CallReader.intent()
            body = plan.body(plan.prompt, tally)
            async with contextlib.aclosing(generate(transport, body, tally)) as deltas:
                async for delta in deltas:
                    for ev in reader.feed(delta):
                        yield ev
                    if reader.found is not None:
                        break  # leaving the block closes the stream: vLLM aborts it
            if reader.found is None:
                for ev in reader.finish():
                    yield ev
                yield Done(tally.finish, tally.tokens, tally.cached)
                return
            yield AutoSwitch()
            before = reader.text[: reader.found].rstrip()
            prompt = plan.prompt + (before + "\n" if before else "")
            tally.finish = "stop"
        stages = _Stages(plan, transport, tally, regexes)
        if plan.stream and plan.exact:
            parser = CallReader.calls_of_any_name(max_calls=MAX_CALLS_PER_TURN)
            async for delta in stages.call_rounds(prompt):
                for ev in parser.feed(delta):
                    yield ev
            calls = [c for c in parser.calls if c.complete]
            invalid = await _check_sent(plan, calls)
        else:
            calls, invalid = [], 0
            async for got in stages.validated_calls(prompt):
                if isinstance(got, Retry):
                    yield got
                else:
                    calls.append(got)
            for c in calls:
                yield CallEvent(c.index, c.id, name=c.name, arguments_delta=c.arguments)
        yield Done(
            "tool_calls" if calls and tally.finish != "length" else tally.finish,
            tally.tokens,
            tally.cached,
            calls=len(calls),
            invalid=invalid,
        )


async def _check_sent(plan: ToolPlan, calls: list[ParsedCall]) -> int:
    """Streamed calls were sent as generated (the regex enforces their schema exactly);
    check them anyway, so a gap in that guarantee shows in logs and metrics."""
    invalid = 0
    for c in calls:
        if await plan.problems(c):
            invalid += 1
            logger.error("invalid tool call left the server: %s %s", c.name, c.arguments)
    return invalid


class _Stages:
    """The two stages of one turn's calls, and their regeneration when invalid."""

    def __init__(
        self, plan: ToolPlan, transport: Transport, tally: Tally, regexes: Regexes
    ) -> None:
        self.plan, self.transport, self.tally = plan, transport, tally
        self.regexes = regexes

    async def call_rounds(
        self, prompt: str, override: dict[str, Any] | None = None
    ) -> AsyncIterator[str]:
        """Constrained text of one or more calls, each in two stages: the head (which tool;
        skipped when only one is offered), then that tool's arguments. The arguments regex
        may end by opening another call; we then continue from there (prefix-cached)."""
        prompt += TOOL_CALL_OPEN
        tools = self.plan.tools
        only = next(iter(tools)) if len(tools) == 1 else None
        for _ in range(MAX_CALLS_PER_TURN):
            if only is not None:
                head = call_head(only)
                yield head
            else:
                head = ""
                async for delta in self._generate(prompt, self.regexes.name, override):
                    head += delta
                    yield delta
                if self.tally.finish != "stop":
                    return
            name = _HEAD_NAME.match(head)
            if name is None or name.group(1) not in self.regexes.arguments:  # pragma: no cover
                raise ToolCallValidationError(f"the engine broke the call head: {head!r}")
            prompt += head
            text = ""
            args_regex = self.regexes.arguments[name.group(1)]
            async for delta in self._generate(prompt, args_regex, override):
                text += delta
                yield delta
            if self.tally.finish != "stop" or not text.endswith(CALL_SEPARATOR):
                return
            prompt += text

    async def _generate(
        self, prompt: str, regex: str, override: dict[str, Any] | None
    ) -> AsyncIterator[str]:
        body = self.plan.body(prompt, self.tally, structured_outputs={"regex": regex})
        if body["max_tokens"] <= 0:
            self.tally.finish = "length"
            return
        with constrained_generation("the tool schema's constraint", hint=_ENGINE_HINT):
            async for delta in generate(self.transport, {**body, **(override or {})}, self.tally):
                yield delta

    async def validated_calls(self, prompt: str) -> AsyncIterator[ParsedCall | Retry]:
        """The turn's calls once they validate (each failed attempt a `Retry` before them)."""
        tally, plan = self.tally, self.plan
        budget_start, spent = tally.tokens, 0

        async def attempt(n: int) -> AsyncIterator[ParsedCall | Retry]:
            nonlocal spent
            tally.tokens, tally.finish = budget_start, "stop"  # each attempt gets the budget
            parser = CallReader.calls_of_any_name(max_calls=MAX_CALLS_PER_TURN)
            override = REGENERATE.sampling(n, plan.temperature)
            async for delta in self.call_rounds(prompt, override):
                parser.feed(delta)
            spent += tally.tokens - budget_start
            calls = [c for c in parser.calls if c.complete]
            problems = [p for c in calls for p in await plan.problems(c)]
            if not calls and tally.finish == "stop":
                problems.append(f"no complete call in {parser.text!r:.200}")
            if not problems:
                tally.tokens = budget_start + spent  # usage reports every attempt
                for c in calls:
                    yield c
                return
            logger.warning("tool call failed validation (attempt %d): %s", n + 1, problems)
            yield Retry(n, problems)

        async for got in regenerating("tool-call arguments", attempt):
            yield got
