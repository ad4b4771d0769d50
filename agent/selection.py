"""Tool selection in the agent runtime: which tools a run offers, and in what order.

A small model picks the wrong tool when many are offered (the first listed, most often).
With ``select="ranked"`` a run ranks its tools once, against its goal, with
`memory.tool_rank.ToolRanker` (the stack's embedding model over each tool's name,
description and parameter names, plus keyword recall), and offers them most relevant first
for the whole run: one order per run, so every step's prompt starts the same and the
server's prefix cache keeps hitting. With ``top_k`` only the k best are offered, plus a
``more_tools`` tool: calling it offers the rest (the way back when the ranking missed).

`ToolSelection` is what the loop holds; `RunTools` is one run's choice, kept on the state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from memory.tool_rank import ToolRanker

__all__ = [
    "ANSWER_TOOL",
    "MORE_TOOLS",
    "RunTools",
    "SelectMode",
    "ToolSelection",
    "answer_tool_spec",
    "more_tools_spec",
]

logger = logging.getLogger(__name__)

SelectMode = Literal["given", "ranked"]
MORE_TOOLS = "more_tools"
ANSWER_TOOL = "final_answer"


def answer_tool_spec() -> dict[str, Any]:
    """``final_answer``: the model answers by a call, as smolagents' tool-calling agents do.
    A small model that calls a tool after every result calls this one once the results
    answer the request; its argument is the run's answer, in the model's own words."""
    return {
        "type": "function",
        "function": {
            "name": ANSWER_TOOL,
            "description": "Give the final answer to the user's request. Call it as soon as "
            "the tool results answer the request, with the answer in plain words.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "minLength": 1, "maxLength": 2000}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }


def more_tools_spec(hidden: int) -> dict[str, Any]:
    """The ``more_tools`` tool offered beside the top k."""
    return {
        "type": "function",
        "function": {
            "name": MORE_TOOLS,
            "description": f"Show {hidden} more tools. Call it only when none of the other "
            "tools can do the task.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }


@dataclass
class RunTools:
    """One run's tools: their order (names) and how many are offered now."""

    order: list[str]
    offered: int
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def hidden(self) -> int:
        return len(self.order) - self.offered

    def expand(self) -> list[str]:
        """Offer every tool from now on; the names that were hidden."""
        added = self.order[self.offered :]
        self.offered = len(self.order)
        return added

    def arrange(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`tools` (the allowed ones, as the registry gives them) in the run's order, cut to
        the offered ones, with ``more_tools`` while some are hidden."""
        by_name = {t["function"]["name"]: t for t in tools}
        shown = [by_name[n] for n in self.order[: self.offered] if n in by_name]
        shown += [t for n, t in by_name.items() if n not in self.order]  # mounted mid-run
        return [*shown, more_tools_spec(self.hidden)] if self.hidden > 0 else shown


@dataclass
class ToolSelection:
    """How a run chooses its tools: ``given`` (the registry's order, all of them) or
    ``ranked`` (by relevance to the goal; ``top_k`` best only, with ``more_tools``)."""

    mode: SelectMode = "given"
    top_k: int | None = None
    ranker: ToolRanker | None = None

    async def choose(self, goal: str, tools: list[dict[str, Any]]) -> RunTools | None:
        """The run's tools, or None to offer them as given."""
        if self.mode == "given" or self.ranker is None or len(tools) < 2:
            if self.mode == "ranked" and self.ranker is None:
                logger.warning("tool selection 'ranked' without a ranker: tools as given")
            return None
        ranking = await self.ranker.rank(goal, tools)
        order = [r.name for r in ranking]
        k = len(order) if self.top_k is None else min(self.top_k, len(order))
        if k == len(order) - 1:  # hiding one tool behind another one saves nothing
            k = len(order)
        return RunTools(order, k, {r.name: round(r.score, 3) for r in ranking})
