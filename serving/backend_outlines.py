"""The ``outlines`` constraint backend: regexes, one call in two engine requests.

vLLM's outlines backend enforces regexes (no structural tags), indexing every automaton state
against the whole vocabulary when it first meets a regex (~3 ms per state here), so
`serving.constraint` builds compact regexes from outlines_core and `serving.schema_cache`
measures their automata first. A call is generated in two stages so that each automaton is the
size of one schema:

* ``required`` / named - the prompt ends with ``<tool_call>\\n``; the call's head (which tool,
  `constraint.name_regex`; skipped when only one is offered), then that tool's arguments
  (`constraint.arguments_regex`), which may end by opening another call (parallel calls).
* ``auto`` - a *lazy constraint*: the model writes freely; `toolcalls.IntentDetector` watches
  for the start of a call (``<tool_call>``, a ```json fence, a bare ``{"name": ...}``). Then
  the free stream is dropped (vLLM aborts it) and the call is generated again under the
  regexes from the text before it, which the prefix cache makes cheap.

All of this path lives here; `serving.chat` hands a constrained turn to `OutlinesBackend.events`
when this backend is configured, and to `serving.turn` for the grammar backends.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from serving.constraint import CompiledSchema, arguments_regex, name_regex
from serving.constraint_backend import BackendName, TurnSpec
from serving.engine import UpstreamError
from serving.envelope import CALL_SEPARATOR, TOOL_CALL_OPEN, call_head
from serving.exceptions import ToolCallValidationError
from serving.metrics import Metrics
from serving.toolcalls import CallEvent, CallStreamParser, IntentDetector, ParsedCall
from serving.turn import MAX_ATTEMPTS, ContentDelta, Done, Event, Tally, ToolPlan

logger = logging.getLogger(__name__)

MAX_CALLS_PER_TURN = 16
_HEAD_NAME = re.compile(r'\{"name": "([^"]*)", "arguments": $')


@dataclass
class Regexes:
    """One request's regexes: the head (which tool), and each tool's arguments."""

    name: str
    arguments: dict[str, str]


class TurnHost(Protocol):
    """What the two stages need from the chat service (`serving.chat.ChatService`)."""

    metrics: Metrics

    def engine_body(
        self, plan: ToolPlan, prompt: str, *, regex: str | None, tally: Tally
    ) -> dict[str, Any]: ...
    def stream_text(self, body: dict[str, Any], tally: Tally) -> AsyncGenerator[str]: ...
    async def problems(self, plan: ToolPlan, call: ParsedCall) -> list[str]: ...
    async def check_sent(self, plan: ToolPlan, calls: list[ParsedCall]) -> int: ...


class OutlinesBackend:
    name: BackendName = "outlines"
    single_request = False

    def exact(self, schema: Any) -> bool:  # decided per schema by `serving.constraint`
        return False

    async def admit(self, spec: TurnSpec, *, what: str) -> dict[str, Any]:
        raise NotImplementedError("the outlines path builds its regexes with `regexes`")

    def warm(self) -> None:
        return None

    def close(self) -> None:
        return None

    @staticmethod
    def regexes(offered: dict[str, CompiledSchema], *, parallel: bool) -> Regexes:
        return Regexes(
            name_regex(list(offered)),
            {n: arguments_regex(c, parallel=parallel) for n, c in offered.items()},
        )

    async def events(
        self, host: TurnHost, plan: ToolPlan, tally: Tally, *, live: bool
    ) -> AsyncIterator[Event]:
        """A constrained turn: free text in ``auto`` until a call starts, then the calls."""
        prompt = plan.prompt
        if plan.mode == "auto":
            detector, sent, intent = IntentDetector(), 0, None
            body = host.engine_body(plan, plan.prompt, regex=None, tally=tally)
            async with contextlib.aclosing(host.stream_text(body, tally)) as deltas:
                async for delta in deltas:
                    safe, intent = detector.feed(delta)
                    if safe > sent:
                        yield ContentDelta(detector.text[sent:safe])
                        sent = safe
                    if intent is not None:
                        break  # leaving the block closes the stream: vLLM aborts it
            if intent is None:
                if len(detector.text) > sent:
                    yield ContentDelta(detector.text[sent:])
                yield Done(tally.finish, tally.tokens, tally.cached)
                return
            host.metrics.auto_switches.inc()
            prompt = plan.prompt + (intent.text_before + "\n" if intent.text_before else "")
            tally.finish = "stop"
        stages = _Stages(host, plan, tally)
        if live and plan.exact:
            parser = CallStreamParser()
            async for delta in stages.call_rounds(prompt):
                for ev in parser.feed(delta):
                    yield ev
            calls = [c for c in parser.calls if c.complete]
            invalid = await host.check_sent(plan, calls)
        else:
            calls = await stages.validated_calls(prompt)  # validated there
            invalid = 0
            for c in calls:
                yield CallEvent(c.index, c.id, name=c.name, arguments_delta=c.arguments)
        host.metrics.tool_calls.labels(mode=plan.mode, valid="true").inc(len(calls) - invalid)
        yield Done(
            "tool_calls" if calls and tally.finish != "length" else tally.finish,
            tally.tokens,
            tally.cached,
        )


class _Stages:
    """The two stages of one turn's calls, and their regeneration when invalid."""

    def __init__(self, host: TurnHost, plan: ToolPlan, tally: Tally) -> None:
        self.host, self.plan, self.tally = host, plan, tally
        assert isinstance(plan.regexes, Regexes)
        self.regexes: Regexes = plan.regexes

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
        body = self.host.engine_body(self.plan, prompt, regex=regex, tally=self.tally)
        if body["max_tokens"] <= 0:
            self.tally.finish = "length"
            return
        try:
            async for delta in self.host.stream_text({**body, **(override or {})}, self.tally):
                yield delta
        except UpstreamError as exc:
            if exc.status_code < 500:
                raise
            raise ToolCallValidationError(
                "the engine failed while generating under the tool schema's constraint - most "
                "often because compiling the schema's automaton took longer than "
                "LOOPSTACK_REGEX_COMPILE_TIMEOUT_S; a simpler schema (fewer optional nested "
                f"fields) avoids it. Engine said: {exc.message}"
            ) from exc

    async def validated_calls(self, prompt: str) -> list[ParsedCall]:
        tally, plan = self.tally, self.plan
        override: dict[str, Any] | None = None
        budget_start, spent = tally.tokens, 0
        for attempt in range(MAX_ATTEMPTS):
            tally.tokens, tally.finish = budget_start, "stop"  # each attempt gets the budget
            parser = CallStreamParser()
            async for delta in self.call_rounds(prompt, override):
                parser.feed(delta)
            spent += tally.tokens - budget_start
            calls = [c for c in parser.calls if c.complete]
            problems = [p for c in calls for p in await self.host.problems(plan, c)]
            if not calls and tally.finish == "stop":
                problems.append(f"no complete call in {parser.text!r:.200}")
            if not problems:
                tally.tokens = budget_start + spent  # usage reports every attempt
                return calls
            self.host.metrics.tool_retries.inc()
            logger.warning("tool call failed validation (attempt %d): %s", attempt + 1, problems)
            temp = max(float(plan.sampling.get("temperature") or 0.0), 0.7)
            override = {"temperature": temp, "seed": attempt + 1}
        raise ToolCallValidationError(
            "the model did not produce tool-call arguments valid for the schema"
        )
