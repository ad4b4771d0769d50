"""Memory as tools for the agent: ``recall_memory`` and ``save_memory``.

``TOOLS`` holds OpenAI-style function definitions (``{"type": "function", "function":
{...}}``) with JSON schemas; :func:`call_tool` validates the arguments against them and
runs the call on a store for one user. The user id never comes from the model: the host
passes it, so a tool call cannot reach another user's memory.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema

from loopstack.memory.exceptions import LoopstackMemoryError, RejectedError
from loopstack.memory.records import MemorySource, MemoryType
from loopstack.memory.store import AsyncMemoryStore
from loopstack.memory.trust import unchecked

__all__ = [
    "RECALL_MEMORY",
    "SAVE_MEMORY",
    "TOOLS",
    "ConfirmUserSaid",
    "MemoryTool",
    "call_tool",
    "memory_tools",
]

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
            "keys): they are removed. A fact concluded from tool results is kept as "
            "unverified (low weight): the results cited in 'evidence' are noted, not "
            "checked; the final answer's facts are checked against the results."
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
                    "description": "True only when the user stated this themselves; the host "
                    "confirms it before the memory counts as said by the user.",
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
    confirm_user_said: ConfirmUserSaid | None = None,
    trust_user_said: bool = False,
) -> str:
    """Run a memory tool call; returns the text to hand back to the model as the result.

    Invalid arguments and refused writes come back as an ``error: ...`` string (the model
    can correct itself); scope errors and storage failures raise.

    ``save_memory``'s ``user_said_it`` is the model's claim, not a fact: the record is only
    stored as said by the user when the host confirms it, through ``confirm_user_said(text)``
    (sync or async, e.g. checking the text against the user's messages or asking the user)
    or by passing ``trust_user_said=True``. Without either (the default) the claim is
    ignored and the record is kept as unverified: ids the model cites in ``evidence`` are kept
    as ``unchecked:ID`` (memory has no result text to check them against; see
    ``loopstack.memory.evidence``).
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
    # The model's citations cannot be checked here (no result texts): kept, proving nothing.
    evidence = [unchecked(e) for e in args.get("evidence", [])]
    claimed = bool(args.get("user_said_it", False))
    explicit = claimed and await _host_confirms(args["text"], confirm_user_said, trust_user_said)
    source = MemorySource.USER_EXPLICIT if explicit else MemorySource.TASK
    settings = store.settings
    weight = settings.default_weight if explicit else settings.unsupported_weight
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
            confidence=1.0 if explicit else 0.4,
        )
    except RejectedError as exc:
        return f"error: not saved: {exc}"
    except LoopstackMemoryError:
        raise
    note = "" if explicit else " (kept as unverified, low weight: cited evidence is not checked)"
    if claimed and not explicit:
        note += " (user_said_it not confirmed by the host: not stored as the user's words)"
    return f"saved as {rid}{note}"


ConfirmUserSaid = Callable[[str], Awaitable[bool] | bool]


async def _host_confirms(text: str, confirm: ConfirmUserSaid | None, trust: bool) -> bool:
    """Whether the host vouches that the user said ``text`` (default: no)."""
    if trust:
        return True
    if confirm is None:
        return False
    answer = confirm(text)
    if inspect.isawaitable(answer):
        answer = await answer
    return bool(answer)


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
        confirm_user_said: ConfirmUserSaid | None = None,
    ) -> None:
        fn = _BY_NAME[name]["function"]
        self.name: str = fn["name"]
        self.description: str = fn["description"]
        self.parameters: dict[str, Any] = fn["parameters"]
        self._store = store
        self._scope = {"user_id": user_id, "agent_id": agent_id, "session_id": session_id}
        self._confirm = confirm_user_said

    async def call(self, arguments: dict[str, Any]) -> str:
        return await call_tool(
            self._store,
            self.name,
            arguments,
            confirm_user_said=self._confirm,
            **self._scope,  # type: ignore[arg-type]
        )


def memory_tools(
    store: AsyncMemoryStore,
    *,
    user_id: str,
    agent_id: str | None = None,
    session_id: str | None = None,
    confirm_user_said: ConfirmUserSaid | None = None,
) -> list[MemoryTool]:
    """``recall_memory`` and ``save_memory`` bound to one user's scope. ``save_memory`` marks a
    record as said by the user only when ``confirm_user_said`` (the host) agrees."""
    return [
        MemoryTool(
            store,
            t["function"]["name"],
            user_id=user_id,
            agent_id=agent_id,
            session_id=session_id,
            confirm_user_said=confirm_user_said,
        )
        for t in TOOLS
    ]
