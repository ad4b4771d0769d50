"""loopstack: tool-using agents on your own open-weight model.

The public API, importable from here (the modules behind it are internal and may move)::

    from loopstack import Agent, AgentConfig, Limits, ToolRegistry, RetryPolicy, tool
    from loopstack import MemoryStore, AsyncMemoryStore
    from loopstack import Worker, worker_tools, load_team, mount_team, TeamConfig
    from loopstack import serve, ServerSettings

Names load on first use (PEP 562), so ``import loopstack`` stays light: the command line
(`loopstack.cli`) and the leaf text utilities (`loopstack.text`) import nothing of the stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Agent",
    "AgentConfig",
    "AsyncMemoryStore",
    "Limits",
    "MemoryStore",
    "PlanMode",
    "RetryPolicy",
    "ServerSettings",
    "TeamConfig",
    "ToolRegistry",
    "Worker",
    "load_team",
    "mount_team",
    "serve",
    "tool",
    "worker_tools",
]

#: public name -> the module that defines it
_WHERE = {
    "Agent": "loopstack.agent.run.loop",
    "AgentConfig": "loopstack.agent.core.settings",
    "Limits": "loopstack.agent.core.settings",
    "PlanMode": "loopstack.agent.core.settings",
    "ToolRegistry": "loopstack.agent.tools.registry",
    "RetryPolicy": "loopstack.agent.tools.retry",
    "tool": "loopstack.agent.tools.registry",
    "Worker": "loopstack.agent.run.team",
    "TeamConfig": "loopstack.agent.run.team",
    "load_team": "loopstack.agent.run.team",
    "mount_team": "loopstack.agent.run.team",
    "worker_tools": "loopstack.agent.run.team",
    "MemoryStore": "loopstack.memory.sync",
    "AsyncMemoryStore": "loopstack.memory.store",
    "ServerSettings": "loopstack.serving.config",
    "serve": "loopstack.serving.server",
}

if TYPE_CHECKING:
    from loopstack.agent.core.settings import AgentConfig, Limits, PlanMode
    from loopstack.agent.run.loop import Agent
    from loopstack.agent.run.team import TeamConfig, Worker, load_team, mount_team, worker_tools
    from loopstack.agent.tools.registry import ToolRegistry, tool
    from loopstack.agent.tools.retry import RetryPolicy
    from loopstack.memory import AsyncMemoryStore, MemoryStore
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.server import serve


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'loopstack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
