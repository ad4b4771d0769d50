"""Tool selection in the agent runtime: which tools a run offers, and in what order.

A small model picks the wrong tool when many are offered (the first listed, most often).
With ``select="ranked"`` every step asks the endpoint to rank the run's tools against the
run's *goal* (``loopstack.tool_rank``: the server's embedding model over each tool's name,
description and parameter names, plus keyword recall; `serving.tool_rank`). The query is the
goal, so the order is one per run: every step's prompt starts the same and the prefix cache
keeps hitting. With ``top_k`` only the k best are offered, plus a ``more_tools`` tool:
calling it offers the rest from the next step on (the way back when the ranking missed).
Ranking needs a loopstack endpoint, as ``no_repeat`` does; the ranking runs where the
embedding model already is, and the agent never loads one.

`ToolSelection` is what the loop holds; `RunTools` is one run's state, kept on `AgentState`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ANSWER_TOOL",
    "MORE_TOOLS",
    "RunTools",
    "SelectMode",
    "ToolSelection",
    "answer_tool_spec",
    "more_tools_spec",
]


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
    """One run's selection state: whether ``more_tools`` has brought every tool back."""

    expanded: bool = False


@dataclass(frozen=True)
class ToolSelection:
    """How a run chooses its tools: ``given`` (the registry's order, all of them) or
    ``ranked`` (by the endpoint, against the goal; ``top_k`` best only, with ``more_tools``)."""

    mode: SelectMode = "given"
    top_k: int | None = None

    def tools(self, tools: list[dict[str, Any]], run: RunTools) -> list[dict[str, Any]]:
        """The step's tools: ``more_tools`` after them while some are held back."""
        if self.mode == "ranked" and self.cuts(run, len(tools)):
            return [*tools, more_tools_spec(len(tools) - (self.top_k or 0))]
        return tools

    def extension(
        self, goal: str, run: RunTools, n: int, pinned: list[str]
    ) -> dict[str, Any] | None:
        """The step's ``loopstack.tool_rank`` for `n` tools: None when they go as given."""
        if self.mode == "given" or n < 2:
            return None
        rank: dict[str, Any] = {"query": goal, "always": [MORE_TOOLS, *pinned]}
        if self.cuts(run, n):
            rank["top_k"] = self.top_k
        return rank

    def cuts(self, run: RunTools, n: int) -> bool:
        """Whether `n` tools are cut to the top k (hiding one behind another saves nothing)."""
        return self.top_k is not None and not run.expanded and n > self.top_k + 1
