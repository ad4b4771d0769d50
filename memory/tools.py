"""Memory as tools for the agent: ``recall_memory`` and ``save_memory``.

``TOOLS`` holds OpenAI-style function definitions (``{"type": "function", "function":
{...}}``) with JSON schemas; :func:`call_tool` validates the arguments against them and
runs the call on a store for one user. The user id never comes from the model: the host
passes it, so a tool call cannot reach another user's memory.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from memory.exceptions import LoopstackMemoryError, RejectedError
from memory.records import MemorySource, MemoryType
from memory.store import AsyncMemoryStore

__all__ = ["RECALL_MEMORY", "SAVE_MEMORY", "TOOLS", "MemoryTool", "call_tool", "memory_tools"]

RECALL_MEMORY: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "recall_memory",
        "description": (
            "Search the user's long-term memory (facts, preferences, decisions, past episodes, "
            "procedures) saved in earlier conversations. Use it when the answer may depend on "
            "something the user told you before and it is not in this conversation. Returns a "
            "few short dated entries, or nothing when no memory is relevant. The user's "
            "current words override anything remembered."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 500,
                    "description": "What to look for, as a short description of the facts "
                    "needed (e.g. 'user's preferred programming language').",
                },
                "budget_tokens": {
                    "type": "integer",
                    "minimum": 50,
                    "maximum": 2000,
                    "description": "Most tokens the result may take (default 600).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}

SAVE_MEMORY: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "save_memory",
        "description": (
            "Save one durable fact, preference, decision or procedure about the user or their "
            "work for future conversations. Save only what will still matter later, as one "
            "short self-contained sentence. Never save secrets (passwords, card numbers, API "
            "keys): they are removed. Facts concluded from tool results must cite those "
            "results in 'evidence', or they are kept with low weight."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 3, "maxLength": 500},
                "type": {
                    "type": "string",
                    "enum": [t.value for t in MemoryType],
                    "description": "Kind of memory (default fact).",
                },
                "evidence": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 200},
                    "maxItems": 16,
                    "description": "ids of the tool results or messages that support it.",
                },
                "user_said_it": {
                    "type": "boolean",
                    "description": "True only when the user stated this themselves.",
                },
            },
            "required": ["text"],
            "additionalProperties": False,
        },
    },
}

TOOLS: list[dict[str, Any]] = [RECALL_MEMORY, SAVE_MEMORY]
_BY_NAME = {t["function"]["name"]: t for t in TOOLS}


async def call_tool(
    store: AsyncMemoryStore,
    name: str,
    arguments: str | dict[str, Any],
    *,
    user_id: str,
    agent_id: str | None = None,
    session_id: str | None = None,
) -> str:
    """Run a memory tool call; returns the text to hand back to the model as the result.

    Invalid arguments and refused writes come back as an ``error: ...`` string (the model
    can correct itself); scope errors and storage failures raise.
    """
    tool = _BY_NAME.get(name)
    if tool is None:
        return f"error: unknown memory tool {name!r}"
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        jsonschema.validate(args, tool["function"]["parameters"])
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        msg = exc.message if isinstance(exc, jsonschema.ValidationError) else str(exc)
        return f"error: invalid arguments for {name}: {msg}"
    if name == "recall_memory":
        rec = await store.recall(
            args["query"],
            user_id=user_id,
            agent_id=agent_id,
            session_id=session_id,
            budget_tokens=int(args.get("budget_tokens", 600)),
        )
        return rec.block or "No relevant memories."
    evidence = list(args.get("evidence", []))
    explicit = bool(args.get("user_said_it", False))
    source = (
        MemorySource.USER_EXPLICIT
        if explicit
        else MemorySource.TASK
        if evidence
        else MemorySource.INFERRED
    )
    settings = store.settings
    weight = settings.default_weight if explicit or evidence else settings.unsupported_weight
    try:
        rid = await store.add(
            args["text"],
            user_id=user_id,
            agent_id=agent_id,
            session_id=session_id,
            type=args.get("type", MemoryType.FACT),
            source=source,
            evidence=evidence,
            weight=weight,
            confidence=1.0 if explicit else 0.7 if evidence else 0.4,
        )
    except RejectedError as exc:
        return f"error: not saved: {exc}"
    except LoopstackMemoryError:
        raise
    note = "" if explicit or evidence else " (no evidence given: kept with low weight)"
    return f"saved as {rid}{note}"


class MemoryTool:
    """One memory tool for one user, shaped like the agent's ``Tool`` protocol (structurally:
    memory never imports the agent). The scope comes from the host, never from the model."""

    dangerous = False

    def __init__(
        self,
        store: AsyncMemoryStore,
        name: str,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
    ) -> None:
        fn = _BY_NAME[name]["function"]
        self.name: str = fn["name"]
        self.description: str = fn["description"]
        self.parameters: dict[str, Any] = fn["parameters"]
        self._store = store
        self._scope = {"user_id": user_id, "agent_id": agent_id, "session_id": session_id}

    async def call(self, arguments: dict[str, Any]) -> str:
        return await call_tool(self._store, self.name, arguments, **self._scope)  # type: ignore[arg-type]


def memory_tools(
    store: AsyncMemoryStore,
    *,
    user_id: str,
    agent_id: str | None = None,
    session_id: str | None = None,
) -> list[MemoryTool]:
    """``recall_memory`` and ``save_memory`` bound to one user's scope."""
    return [
        MemoryTool(
            store, t["function"]["name"], user_id=user_id, agent_id=agent_id, session_id=session_id
        )
        for t in TOOLS
    ]
