"""The seams the agent depends on. Anything with these attributes is a tool: a typed Python
function wrapped by `loopstack.agent.tools.registry`, an MCP server's tool
(`loopstack.agent.tools.mcp`), or memory's tools (`loopstack.memory.tools`, which satisfies `Tool`
structurally and never imports `agent`).

A tool's ``call`` returns JSON-serialisable data or raises; the registry validates the
arguments before the call and wraps the outcome as ``{"status", "data", "error"}``
(`ToolResult`), so a tool never builds that envelope itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

ToolStatus = Literal["ok", "error"]


@runtime_checkable
class Tool(Protocol):
    """One callable tool, described by a JSON Schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object
    dangerous: bool  # needs approval before each call

    async def call(self, arguments: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model, as JSON, in the ``role: tool`` message."""

    status: ToolStatus
    data: Any = None
    error: dict[str, Any] | None = None  # {"type": ..., "message": ...}, see error_body
    attempts: int = 1  # calls made under the tool's retry policy (loopstack.agent.tools.retry)
    retried: tuple[str, ...] = ()  # the errors of the attempts that failed before this one

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "data": self.data, "error": self.error}


@runtime_checkable
class MemoryLink(Protocol):
    """Long-term memory as the loop uses it (`loopstack.agent.run.longterm.StoreMemory` implements
    it)."""

    async def recall(self, query: str) -> str:
        """The block to put into the system prompt ('' when nothing is relevant)."""
        ...

    async def write_back(
        self, goal: str, answer: str, *, evidence: Mapping[str, str], done: bool
    ) -> None:
        """Offer the finished run to memory; ``evidence`` maps each successful tool result's
        trace id to its text (what the model saw), so memory can check the answer against
        the results instead of taking the ids on faith."""
        ...
