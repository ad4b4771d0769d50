"""Chat completions: the wire API's front-end. It turns the events a constraint backend
resolves a request into (`serving.constraint.resolve`) into the reply, whole or as SSE.

`ChatService.create(req)` returns an `Answer`: the body (a JSON object, or the SSE stream)
and the headers the reply carries. What it does itself:

1. ``loopstack.tool_rank`` (`serving.selection`): the tools ranked and cut first, said in
   ``x-loopstack-tools-offered``;
2. the request as the backends take it (`TurnRequest`: the prompt renderer, the engine's
   model name, the tool turn's budget, ``loopstack.abstain``'s rule);
3. `Resolver.resolve` - the configured backend, or the unconstrained baseline - owns the
   rest: admission, schema repair, ``no_repeat``, planning, the constraint compiled first,
   the turn and its regenerate loop, and what passes through to the engine as it is;
4. the events as the reply: `Header`s until `Ready` (everything a 400 can come from is
   behind it), then content and tool-call deltas and `Done`; a passed-through request's
   answer (`Whole`, `Relay`) as it came. The tool metrics are counted from the events here
   (`_counted`, the one place).

`completion(body)` is ``/v1/completions``: its client constraint admitted, relayed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from serving.constraint.backend import ConstraintBackend
from serving.constraint.calltext import CallEvent, ContentDelta
from serving.constraint.resolve import Resolver, TurnRequest
from serving.constraint.turn import (
    MAX_ATTEMPTS,
    AutoSwitch,
    Done,
    Event,
    Header,
    Ready,
    Relay,
    Retry,
    Whole,
)
from serving.engine.supervisor import Engine
from serving.exceptions import InvalidRequest
from serving.metrics import Metrics
from serving.prompt import PromptBuilder
from serving.protocol import (
    ChatCompletionRequest,
    chat_chunk,
    chat_response,
    completion_id,
    tool_call_dict,
)
from serving.selection.defaults import SelectionDefaults
from serving.selection.rank import ToolRanker
from serving.selection.requests import ABSTAIN_RULE, rank_request

__all__ = ["MAX_ATTEMPTS", "Answer", "ChatService"]

logger = logging.getLogger(__name__)
MAX_HEADER = 1000  # a header's value is cut to this many characters


@dataclass
class Answer:
    """What a front-end returns: the body (whole, or the SSE stream) and its headers."""

    body: dict[str, Any] | AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


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
        self.backend = backend  # built complete by `serving.constraint.factory`
        self.resolver = Resolver(backend)
        self.metrics = metrics
        self.max_tool_tokens = max_tool_tokens
        self.ranker = ranker  # `loopstack.tool_rank` (None: the extension is refused)
        # what a request that does not say gets (serving.selection.defaults)
        self.selection = selection or SelectionDefaults()

    # -- entry points ---------------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest, *, server_defaults: bool = True) -> Answer:
        """`req` answered. `server_defaults`: a request that does not say how its tools are
        selected gets the server's selection defaults (`serving.selection.defaults`); the
        agent-harness front-ends (Responses, Messages) pass False: a harness offers the tools a
        whole task needs, and ranking them by its latest message dropped the ones it called
        next (Claude Code lost Read)."""
        headers: dict[str, str] = {}
        req, applied = self.selection.apply(req) if server_defaults else (req, [])
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
            system_rule=ABSTAIN_RULE if req.loopstack.abstain else None,
        )
        events = self.resolver.resolve(request, self.engine.transport)
        async for ev in events:  # up to the turn's start: headers, or a passed-through answer
            if isinstance(ev, Header):
                headers[ev.name] = ev.value[:MAX_HEADER]
            elif isinstance(ev, Whole):
                return Answer(ev.body, headers)
            elif isinstance(ev, Relay):
                return Answer(ev.lines, headers)
            elif isinstance(ev, Ready):
                self.metrics.tool_requests.labels(mode=ev.mode).inc()
                turn = self._counted(ev, events)
                if req.stream:
                    return Answer(self._stream_tools(req, ev, turn), headers)
                return Answer(await self._complete_tools(req, ev, turn), headers)
        raise AssertionError("a backend's resolve ended before its reply")  # pragma: no cover

    async def completion(self, body: dict[str, Any]) -> dict[str, Any] | AsyncIterator[bytes]:
        """A /v1/completions body: its client constraint admitted (or 400), relayed."""
        return await self.resolver.completion(body, self.engine.transport)

    # -- tool calls ---------------------------------------------------------------------
    async def _counted(
        self, ready: Ready, events: AsyncIterator[Event]
    ) -> AsyncIterator[ContentDelta | CallEvent | Done]:
        """The turn's events for the reply; the one place the tool metrics count."""
        async for ev in events:
            if isinstance(ev, Retry):
                self.metrics.tool_retries.inc()
            elif isinstance(ev, AutoSwitch):
                self.metrics.auto_switches.inc()
            elif isinstance(ev, ContentDelta | CallEvent | Done):
                if isinstance(ev, Done) and ev.checked:
                    calls = self.metrics.tool_calls
                    calls.labels(mode=ready.mode, valid="true").inc(ev.calls - ev.invalid)
                    calls.labels(mode=ready.mode, valid="false").inc(ev.invalid)
                yield ev

    # -- assembling responses -------------------------------------------------------------
    async def _complete_tools(
        self, req: ChatCompletionRequest, ready: Ready, turn: AsyncIterator[Event]
    ) -> dict[str, Any]:
        content, done = "", Done("stop", 0)
        calls: dict[int, dict[str, Any]] = {}
        async for ev in turn:
            if isinstance(ev, ContentDelta):
                content += ev.text
            elif isinstance(ev, CallEvent):
                call = calls.setdefault(ev.index, tool_call_dict(ev.id, ev.name or "", ""))
                call["function"]["arguments"] += ev.arguments_delta
            elif isinstance(ev, Done):
                done = ev
        return chat_response(
            id_=completion_id(),
            model=req.model,
            content=content.strip() or None if calls else content,
            tool_calls=[calls[i] for i in sorted(calls)],
            finish_reason=done.finish_reason,
            usage=_usage(ready.prompt_tokens, done.completion_tokens, done.cached_tokens),
        )

    async def _stream_tools(
        self, req: ChatCompletionRequest, ready: Ready, turn: AsyncIterator[Event]
    ) -> AsyncIterator[bytes]:
        id_, model = completion_id(), req.model

        def sse(**kw: Any) -> bytes:
            return b"data: " + json.dumps(chat_chunk(id_=id_, model=model, **kw)).encode() + b"\n\n"

        yield sse(delta={"role": "assistant", "content": ""})
        async for ev in turn:
            if isinstance(ev, ContentDelta):
                yield sse(delta={"content": ev.text})
            elif isinstance(ev, CallEvent):
                d: dict[str, Any] = {
                    "index": ev.index,
                    "function": {"arguments": ev.arguments_delta},
                }
                if ev.name is not None:
                    d.update(id=ev.id, type="function")
                    d["function"]["name"] = ev.name
                yield sse(delta={"tool_calls": [d]})
            elif isinstance(ev, Done):
                yield sse(finish_reason=ev.finish_reason)
                if req.include_usage:
                    yield sse(
                        usage=_usage(ready.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                    )
        yield b"data: [DONE]\n\n"


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:  # the engine runs with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage
