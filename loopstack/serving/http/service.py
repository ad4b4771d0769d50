"""The chat service: one chat request, resolved by the constraint backend, as one `Turn`.

Every wire API (chat completions, Responses, Messages) translates its request into a
`loopstack.serving.protocol.ChatCompletionRequest` and hands it here; what comes back is the same
for all three, so the same conversation reaches the engine as the same prompt, under the same
constraint and the same selection defaults, whichever API it came through. What
`ChatService.turn(req)` does:

1. the server's selection defaults (`loopstack.serving.selection.defaults`) for a request that does
   not
   say how its tools are selected, said in ``x-loopstack-selection``;
2. ``loopstack.tool_rank`` (`loopstack.serving.selection`): the tools ranked and cut, said in
   ``x-loopstack-tools-offered``;
3. the request as the backends take it (`TurnRequest`: the prompt renderer, the engine's
   model name, the tool turn's budget, ``loopstack.abstain``'s rule);
4. `Resolver.resolve` - the configured backend, or the unconstrained baseline - owns the
   rest: admission, schema repair, ``no_repeat``, planning, the constraint compiled first,
   the turn and its regenerate loop, and what passes through to the engine as it is.

Everything a 400 can come from happens before `turn` returns. The `Turn` carries the headers
and either the typed events of a tool turn (`loopstack.serving.http.events`; the tool metrics
counted here, `_counted`, the one place) or the engine's own answer to a request passed through.

`completion(body)` is ``/v1/completions``: its client constraint admitted, relayed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from loopstack.serving.constraint.backend import ConstraintBackend
from loopstack.serving.constraint.calltext import CallEvent, ContentDelta
from loopstack.serving.constraint.resolve import Resolver, TurnRequest
from loopstack.serving.constraint.turn import (
    MAX_ATTEMPTS,
    AutoSwitch,
    Done,
    Header,
    Ready,
    Relay,
    Retry,
    Whole,
)
from loopstack.serving.constraint.turn import (
    Event as BackendEvent,
)
from loopstack.serving.engine.supervisor import Engine
from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.events import (
    CallDelta,
    CallStart,
    Completion,
    Event,
    Finish,
    TextDelta,
    Usage,
    completion_of,
    events_of_chunk,
    fold,
)
from loopstack.serving.metrics import Metrics
from loopstack.serving.prompt import PromptBuilder
from loopstack.serving.protocol import ChatCompletionRequest
from loopstack.serving.selection.defaults import SelectionDefaults
from loopstack.serving.selection.rank import ToolRanker
from loopstack.serving.selection.requests import closing_rule, rank_request, system_rules

__all__ = ["MAX_ATTEMPTS", "ChatService", "Turn", "wire_headers"]

logger = logging.getLogger(__name__)
MAX_HEADER = 1000  # a header's value is cut to this many characters


def wire_headers(headers: dict[str, str]) -> dict[str, str]:
    """`headers` as HTTP can carry them: values say what a client sent (tool names, notes),
    which may be any text, and a header is latin-1 on the wire (a non-latin-1 tool name was a
    500): anything outside printable ASCII is escaped or blanked, each value cut to
    `MAX_HEADER`."""
    out = {}
    for key, value in headers.items():
        text = value.encode("ascii", "backslashreplace").decode("ascii")
        out[key] = _CONTROL.sub(" ", text)[:MAX_HEADER]
    return out


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass
class Turn:
    """One chat request's answer, before any wire format: its headers, and either the typed
    events of a generated tool turn (`generated`) or the engine's own answer to a request it
    was passed (`passed`: the whole ``chat.completion``, or the stream's chunk objects).

    `events()` is the answer as typed events either way; `completion()` folds them."""

    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int | None = None  # counted for a tool turn
    generated: AsyncIterator[Event] | None = None
    passed: dict[str, Any] | AsyncIterator[dict[str, Any]] | None = None

    def events(self) -> AsyncIterator[Event]:
        if self.generated is not None:
            return self.generated
        return _events_of(self.passed)

    async def completion(self) -> Completion:
        if isinstance(self.passed, dict):
            return completion_of(self.passed)
        return await fold(self.events())

    async def aclose(self) -> None:
        """Close the engine stream (vLLM aborts the generation) if it was not read."""
        for it in (self.generated, self.passed):
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()


async def _events_of(
    passed: dict[str, Any] | AsyncIterator[dict[str, Any]] | None,
) -> AsyncIterator[Event]:
    if passed is None:
        return
    if isinstance(passed, dict):
        done = completion_of(passed)
        if done.text:
            yield TextDelta(done.text)
        for i, call in enumerate(done.calls):
            yield CallStart(i, call.id, call.name)
            if call.arguments:
                yield CallDelta(i, call.arguments)
        yield Finish(done.finish, done.matched)
        if done.usage is not None:
            yield done.usage
        return
    seen: set[int] = set()
    try:
        async for chunk in passed:
            for ev in events_of_chunk(chunk, seen):
                yield ev
    finally:
        aclose = getattr(passed, "aclose", None)
        if aclose is not None:
            await aclose()


class ChatService:
    def __init__(
        self,
        engine: Engine,
        prompts: PromptBuilder,
        *,
        backend: ConstraintBackend,
        metrics: Metrics,
        max_tool_tokens: int = 1024,
        ranker: ToolRanker | None = None,
        selection: SelectionDefaults | None = None,
    ):
        self.engine = engine
        self.prompts = prompts
        self.backend = backend  # built complete by `loopstack.serving.constraint.factory`
        self.resolver = Resolver(backend)
        self.metrics = metrics
        self.max_tool_tokens = max_tool_tokens
        self.ranker = ranker  # `loopstack.tool_rank` (None: the extension is refused)
        # what a request that does not say gets (loopstack.serving.selection.defaults)
        self.selection = selection or SelectionDefaults()

    # -- entry points ---------------------------------------------------------------------
    async def turn(self, req: ChatCompletionRequest) -> Turn:
        """`req` answered: everything that can refuse it (a 400) has run when this returns.
        Every front-end gets the same selection defaults: a request is served by what it
        says, not by the API it came through."""
        headers: dict[str, str] = {}
        req, applied = self.selection.apply(req)
        if applied:
            headers["x-loopstack-selection"] = "server defaults: " + ",".join(applied)
        if req.loopstack.tool_rank is not None and req.tools:
            if self.ranker is None:
                raise InvalidRequest(
                    "loopstack.tool_rank needs the server's embedding model", param="loopstack"
                )
            req = await rank_request(req, self.ranker)
            offered = ",".join(t.function.name for t in req.tools or [])
            headers["x-loopstack-tools-offered"] = offered[:MAX_HEADER]
        request = TurnRequest(
            chat=req,
            prompts=self.prompts,
            engine_model=self.engine.model_name,
            max_tool_tokens=self.max_tool_tokens,
            system_rule=system_rules(req),
            closing_rule=closing_rule(req),
        )
        events = self.resolver.resolve(request, self.engine.transport)
        async for ev in events:  # up to the turn's start: headers, or a passed-through answer
            if isinstance(ev, Header):
                headers[ev.name] = ev.value[:MAX_HEADER]
            elif isinstance(ev, Whole):
                return Turn(headers, passed=ev.body)
            elif isinstance(ev, Relay):
                return Turn(headers, passed=ev.chunks)
            elif isinstance(ev, Ready):
                self.metrics.tool_requests.labels(mode=ev.mode).inc()
                return Turn(headers, ev.prompt_tokens, generated=self._counted(ev, events))
        raise AssertionError("a backend's resolve ended before its reply")  # pragma: no cover

    async def completion(
        self, body: dict[str, Any]
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """A /v1/completions body: its client constraint admitted (or 400), relayed."""
        return await self.resolver.completion(body, self.engine.transport)

    # -- tool calls ---------------------------------------------------------------------
    async def _counted(
        self, ready: Ready, events: AsyncIterator[BackendEvent]
    ) -> AsyncIterator[Event]:
        """The turn's events, typed for the front-ends; the one place the tool metrics count."""
        try:
            async for ev in events:
                if isinstance(ev, Retry):
                    self.metrics.tool_retries.inc()
                elif isinstance(ev, AutoSwitch):
                    self.metrics.auto_switches.inc()
                elif isinstance(ev, ContentDelta):
                    if ev.text:
                        yield TextDelta(ev.text)
                elif isinstance(ev, CallEvent):
                    if ev.name is not None:
                        yield CallStart(ev.index, ev.id, ev.name)
                    if ev.arguments_delta:
                        yield CallDelta(ev.index, ev.arguments_delta)
                elif isinstance(ev, Done):
                    if ev.checked:
                        calls = self.metrics.tool_calls
                        calls.labels(mode=ready.mode, valid="true").inc(ev.calls - ev.invalid)
                        calls.labels(mode=ready.mode, valid="false").inc(ev.invalid)
                    yield Finish(ev.finish_reason)
                    yield Usage(ready.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
