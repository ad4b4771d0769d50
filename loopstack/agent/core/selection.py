"""Tool selection in the agent runtime: which tools a run offers, and in what order.

A small model picks the wrong tool when many are offered (the first listed, most often).
With ``select="ranked"`` every step asks the endpoint to rank the run's tools against the
run's *goal* (``loopstack.tool_rank``: the server's embedding model over each tool's name,
description and parameter names, plus keyword recall; `loopstack.serving.selection.rank`). The query
is the goal, so the order is one per run: every step's prompt starts the same and the prefix cache
keeps hitting. With ``top_k`` only the k best are offered, plus a ``more_tools`` tool: calling it
offers the rest from the next step on (the way back when the ranking missed). Ranking needs a
loopstack endpoint, as ``no_repeat`` does; the ranking runs where the embedding model already is,
and the agent never loads one.

`ToolSelection` is what the loop holds; `RunTools` is one run's state, kept on `AgentState`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from loopstack.agent.tools.registry import loads_arguments

__all__ = [
    "ANSWER_TOOL",
    "MORE_TOOLS",
    "RunTools",
    "SelectMode",
    "ToolSelection",
    "answer_call",
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


def answer_call(message: dict[str, Any]) -> str | None:
    """The ``answer`` of a `final_answer` call in an assistant message, if it has one."""
    for c in message.get("tool_calls") or []:
        if c["function"]["name"] == ANSWER_TOOL:
            answer = loads_arguments(c["function"]["arguments"]).get("answer")
            return str(answer) if answer else None
    return None


@dataclass
class RunTools:
    """One run's selection state: whether ``more_tools`` has brought every tool back."""

    expanded: bool = False


@dataclass(frozen=True)
class ToolSelection:
    """How a run offers its tools: ``given`` (the registry's order, all of them) or
    ``ranked`` (by the endpoint, against the goal; ``top_k`` best only, with ``more_tools``);
    ``no_repeat`` asks the server's grammar to refuse a call identical to one answered;
    ``answer_tool`` offers `final_answer`."""

    mode: SelectMode = "given"
    top_k: int | None = None
    no_repeat: bool = False
    answer_tool: bool = False

    def request(
        self, own: list[dict[str, Any]], goal: str, run: RunTools, *, required: bool
    ) -> dict[str, Any]:
        """A step's ``tools``, ``tool_choice`` and ``loopstack`` fields for the run's own
        (allowed) tools; nothing when there are none."""
        ranked, cut = self.mode == "ranked" and len(own) > 1, self.cuts(run, len(own))
        tools = [*own, more_tools_spec(len(own) - (self.top_k or 0))] if ranked and cut else own
        if self.answer_tool and tools and not required:  # last: the cached prefix stays
            tools = [*tools, answer_tool_spec()]
        if not tools:
            return {}
        kw: dict[str, Any] = {"tools": tools, "tool_choice": "required" if required else "auto"}
        ext: dict[str, Any] = {"no_repeat": True} if self.no_repeat else {}
        if ranked:
            ext["tool_rank"] = {"query": goal, "always": [MORE_TOOLS, ANSWER_TOOL]}
            if cut:
                ext["tool_rank"]["top_k"] = self.top_k
        elif self.answer_tool and not required:
            # a server's default ranking (the 0.5B's: top 5, floor 0.15) could cut the answer
            # tool, which never fits the request: the tools go as given, ranking off
            ext["tool_rank"] = None
        if ext:
            kw["loopstack"] = ext
        return kw

    def cuts(self, run: RunTools, n: int) -> bool:
        """Whether `n` tools are cut to the top k (hiding one behind another saves nothing)."""
        return self.top_k is not None and not run.expanded and n > self.top_k + 1
