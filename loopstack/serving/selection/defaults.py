"""Tool selection that clients get without asking: the server's defaults for a request's
``loopstack`` selection fields, and the decision written before a call.

A request that offers tools and does not say how they are selected gets the operator's
defaults (`ServerSettings`: ``LOOPSTACK_TOOL_RANK``, ``LOOPSTACK_TOOL_TOP_K``,
``LOOPSTACK_TOOL_MIN_SCORE``, ``LOOPSTACK_TOOL_ABSTAIN``, ``LOOPSTACK_TOOL_DECIDE``), and where
the operator says nothing, the defaults shipped for the served model (`SHIPPED`, chosen by
measurement: docs/benchmarks.md, "Selection defaults"). What a request says wins, field by
field of ``loopstack``:

* ``tool_rank`` - absent: the server's ranking (when on: ``top_k`` and ``min_score`` its
  defaults); an object: exactly that ranking (its unset keys are off, as before: an agent
  that ranks its own tools keeps every tool it asks for); ``null`` or ``false``: no ranking.
* ``abstain`` / ``decide`` - absent: the server's; ``true``/``false``: that.

The response says what was offered whenever the tools were ranked
(``x-loopstack-tools-offered``), and which defaults were applied
(``x-loopstack-selection``).

**The decision** (``decide``, `DECIDE_RULE`; guidance backend, ``auto`` only): the turn's
grammar first admits one line, ``Decision: <tool name | none> <a few words>`` (capped at
`DECISION_MAX_TOKENS` tokens), then the call of that tool, or text when it says ``none``. The
line is hidden from the response (`hide_decision`): the client sees an ordinary reply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from loopstack.serving.protocol import ChatCompletionRequest, ToolRankOptions

__all__ = [
    "RANK_MAX_TOOLS",
    "SHIPPED",
    "SelectionDefaults",
    "ends_with_results",
    "selection_defaults",
]

#: The server's ranking applies to requests offering at most this many tools: it was measured
#: at 5 and 10 (docs/benchmarks.md, "Tool selection"). A larger set is a harness's toolbox for
#: a whole task (Claude Code sends 24), which its latest message cannot rank: ranking it
#: dropped the Read Claude Code called next. The same rule for every API.
RANK_MAX_TOOLS = 10


_RULES = ("abstain", "decide", "after_results")  # the boolean fields a request may leave unsaid


def ends_with_results(req: ChatCompletionRequest) -> bool:
    """Whether the conversation ends with tool results (where ``after_results`` is said)."""
    return bool(req.messages) and req.messages[-1].role == "tool"


@dataclass(frozen=True)
class SelectionDefaults:
    """What a request that says nothing gets: ranking (with ``top_k``, ``min_score``), the
    abstention rule, the decision before the call."""

    rank: bool = False
    top_k: int | None = None
    min_score: float | None = None
    abstain: bool = False
    decide: bool = False
    after_results: bool = False

    def describe(self) -> str:
        parts = []
        if self.rank:
            parts.append(
                "rank"
                + (f" top_k={self.top_k}" if self.top_k else "")
                + (f" min_score={self.min_score:g}" if self.min_score is not None else "")
            )
        parts += [k for k in _RULES if getattr(self, k)]
        return ", ".join(parts) or "none"

    def apply(self, req: ChatCompletionRequest) -> tuple[ChatCompletionRequest, list[str]]:
        """`req` with every selection field it leaves unsaid set to the default; the names
        of the defaults that changed it (empty: `req` itself, unchanged). Only a request that
        leaves the choice to the model (``auto``) gets them: the floor and the rule are about
        whether to call at all, and a ``required`` or named request must keep every tool it
        offers (a named tool the ranking dropped was a 200 instead of the 400 it is)."""
        if not req.tools or req.effective_tool_choice() != "auto":
            return req, []
        opts, said = req.loopstack, req.loopstack.model_fields_set
        update: dict[str, Any] = {}
        if "tool_rank" not in said and self.rank and len(req.tools) <= RANK_MAX_TOOLS:
            update["tool_rank"] = ToolRankOptions(top_k=self.top_k, min_score=self.min_score)
        answered = ends_with_results(req)
        for key in _RULES:
            if key == "after_results" and not answered:
                continue  # said only after tool results: not applied (nor named) before
            if key not in said and getattr(self, key):
                update[key] = True
        if not update:
            return req, []
        applied: list[str] = [k for k in ("tool_rank", *_RULES) if k in update]
        ext = opts.model_copy(update=update)
        return req.model_copy(update={"loopstack": ext}), applied


# Shipped per served model (docs/benchmarks.md, "Selection defaults"; the rule there: no worse
# than "off" on the right tool at 10 tools nor on calls kept over every request that needs a
# tool, fewer false calls, the README's agent examples still pass, golden not lower). A model
# not listed: all off.
# - The 0.5B: ranking, top 5, floor 0.15 (English requests only: `floor_applies`), the rule
#   (2026-12-06, box C idle, the same hour; docs/results/selection-redecide-2026-12-06, the
#   rule written before the runs): of 42 requests that need a tool (the bench's 18 at 10
#   tools and the 24 everyday wordings, "Is it raining in Oslo?") right tool 32 against 24
#   off, calls kept 36 against 34, false calls 5/40 against 11/40; README examples passed in
#   three runs; golden 20/39 as off. Floor 0.3 (shipped before) had 2 false calls fewer (3/40) but
#   kept 29 calls of 42 (everyday 12/24): its floor dropped tools from requests worded
#   without the tools' words. 0.15 is the everyday right tools' lowest score: chosen on that
#   set. "What time is it now in Tokyo?" had called convert_time while the ranker read the
#   example 'Asia/Tokyo' in its description, left out since (fb6ec81). Asked in Chinese
#   (no floor: `floor_applies`) the set measured on 12-06: right 17/24, kept 19/24, false
#   calls 7/40 (off 13/24, 20/24, 15/40).
# - The 1.5B: the abstention rule alone (2026-12-05): right tool and calls kept 18/18 with it
#   as without, false calls 13/40 against 20/40; README examples passed; golden 30/39 as
#   without. Its top 5 + floor 0.3 + rule kept 16/18 calls: not shipped.
# - The 1.5B, the results rule too (2026-12-07, this box idle, float32): asked the weather,
#   given "19°C and foggy", it answered with the result in 4 of 8 samples without the rule at
#   its published sampling defaults, 8 of 8 with it (docs/benchmarks.md, "After tool results").
MEASURED_0_5B = SelectionDefaults(rank=True, top_k=5, min_score=0.15, abstain=True)
SHIPPED: dict[str, SelectionDefaults] = {
    "qwen2.5-coder-0.5b-instruct": MEASURED_0_5B,
    "qwen2.5-coder-1.5b-instruct": SelectionDefaults(abstain=True, after_results=True),
}

_T = TypeVar("_T")


def _pick(setting: _T | None, shipped: _T) -> _T:
    return shipped if setting is None else setting


def selection_defaults(
    model: str,
    *,
    rank: bool | None = None,
    top_k: int | None = None,
    min_score: float | Literal["off"] | None = None,
    abstain: bool | None = None,
    decide: bool | None = None,
    after_results: bool | None = None,
) -> SelectionDefaults:
    """The defaults of a server serving `model`: each operator setting that is set (not
    None) over the model's shipped defaults. ``top_k=0`` and ``min_score="off"`` say "none"."""
    base = SHIPPED.get(model, SelectionDefaults())
    cut = _pick(top_k, base.top_k)
    floor = base.min_score if min_score is None else None if min_score == "off" else min_score
    return replace(
        base,
        rank=_pick(rank, base.rank),
        top_k=cut or None,
        min_score=floor,
        abstain=_pick(abstain, base.abstain),
        decide=_pick(decide, base.decide),
        after_results=_pick(after_results, base.after_results),
    )
