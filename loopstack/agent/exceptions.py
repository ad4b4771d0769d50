"""Exceptions raised by the agent package.

Tree::

    AgentError                    root: anything the agent runtime raises
    ├── ConfigError               bad settings, tool file or CLI arguments (fatal)
    ├── ModelError                the endpoint failed in a way the loop cannot recover from
    │                             (``status``: the endpoint's HTTP status, when it answered)
    └── ToolError                 a tool failed; the loop turns it into a structured result
        ├── ToolArgumentsError    arguments did not validate against the tool's schema
        ├── ToolNotAllowed        the tool is not mounted or not in the run's allowlist
        ├── ToolDenied            a dangerous or suspicious call was not approved
        ├── ToolTimeout           the tool ran past its timeout and was cancelled
        ├── ToolServerError       an MCP server crashed, hung or answered garbage
        ├── TeamRefused           a sub-task not handed out: depth, fan-out, loop guard or
        │                         no budget left (``kind`` says which)
        └── WorkerFailed          a worker agent ended without an answer

Recoverable errors (every `ToolError`) go back to the model as observations, built by
`error_body`; the others end the run with status ``error``.
"""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    kind: str = "agent_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(AgentError):
    kind = "config_error"


class ModelError(AgentError):
    """The model endpoint failed: ``status`` is the HTTP status it answered with (``None``
    when it did not answer: a timeout, a refused connection)."""

    kind = "model_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ToolError(AgentError):
    kind = "tool_error"


class ToolArgumentsError(ToolError):
    kind = "invalid_arguments"


class ToolNotAllowed(ToolError):
    kind = "not_allowed"


class ToolDenied(ToolError):
    kind = "denied"


class ToolTimeout(ToolError):
    kind = "timeout"


class ToolServerError(ToolError):
    kind = "server_error"


class TeamRefused(ToolError):
    kind = "team_refused"

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # depth_limit | fan_out_limit | loop_guard | budget


class WorkerFailed(ToolError):
    kind = "worker_failed"


def error_body(exc: AgentError) -> dict[str, Any]:
    """The one place a tool error becomes the ``error`` field of a structured result."""
    return {"type": exc.kind, "message": exc.message}
