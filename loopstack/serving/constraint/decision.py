"""The decision written before a call (``loopstack.decide``; guidance backend, ``auto``
only): the turn's grammar first admits one line, ``Decision: <tool name | none> <a few
words>`` (capped at `DECISION_MAX_TOKENS` tokens), then the call of that tool, or text when it
says ``none`` (`loopstack.serving.constraint.guidance`). The line is hidden from the response
(`hide_decision`): the client sees an ordinary reply. Whether a request decides is the
selection defaults' business (`loopstack.serving.selection.defaults`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from loopstack.serving.constraint.turn import ContentDelta, Retry, TurnEvent

__all__ = ["DECIDE_RULE", "DECISION_HEAD", "DECISION_MAX_TOKENS", "hide_decision"]

DECISION_HEAD = "Decision: "
DECISION_MAX_TOKENS = 16  # the paper's 8-32-token window (arXiv 2604.02155); 256 hurt
DECIDE_RULE = (
    "Start your reply with one line: `Decision: ` then the name of the one tool to call, or "
    "`none` when no tool fits the request, and a few words of its key arguments. Then make "
    "that call, or answer in text."
)


async def hide_decision(events: AsyncIterator[TurnEvent]) -> AsyncIterator[TurnEvent]:
    """`events` without the decision line: content text up to and including the first
    newline is dropped (from the start again after a regenerated attempt, `Retry`)."""
    hidden = False
    async for ev in events:
        if isinstance(ev, Retry):
            hidden = False
        if hidden or not isinstance(ev, ContentDelta):
            yield ev
            continue
        _, newline, rest = ev.text.partition("\n")
        if newline:
            hidden = True
            if rest:
                yield ContentDelta(rest)
