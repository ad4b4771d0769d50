"""Long-term memory for the agent: `loopstack.memory.AsyncMemoryStore` behind the `MemoryLink` seam.

Before a run, ``recall(goal)`` returns the store's ``<memory>`` block for the system prompt;
after it, ``write_back`` offers the finished turn to the store's promotion gate (explicit
"remember ...", corrections, task conclusions with the texts of the results they may rest on:
the gate keeps a conclusion as evidence-backed only when those results hold what it asserts,
``loopstack.memory.evidence``). ``tools()`` are
``recall_memory`` / ``save_memory`` bound to the same user (the model never picks the user).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loopstack.memory import AsyncMemoryStore, Recall, Turn, memory_tools

__all__ = ["StoreMemory", "open_store"]

logger = logging.getLogger(__name__)


class StoreMemory:
    """One user's memory, as the loop's `loopstack.agent.protocols.MemoryLink`."""

    def __init__(
        self,
        store: AsyncMemoryStore,
        *,
        user_id: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        budget_tokens: int | None = None,
    ) -> None:
        self.store = store
        self.user_id = user_id
        self.agent_id = agent_id
        self.session_id = session_id
        self.budget_tokens = budget_tokens  # None: the store's configured default

    async def recall(self, query: str) -> str:
        return (await self.recall_explained(query)).block

    async def recall_explained(self, query: str) -> Recall:
        """The store's `Recall`: the block and every candidate's verdict
        (loopstack.agent.observe.explain)."""
        return await self.store.recall(
            query,
            user_id=self.user_id,
            agent_id=self.agent_id,
            session_id=self.session_id,
            budget_tokens=self.budget_tokens,
        )

    async def write_back(
        self, goal: str, answer: str, *, evidence: Mapping[str, str], done: bool
    ) -> None:
        turn = Turn(
            user_message=goal,
            assistant_message=answer,
            task_conclusion=answer if done and answer else None,
            evidence=list(evidence),
            observations=dict(evidence),
        )
        results = await self.store.write_back(
            turn, user_id=self.user_id, agent_id=self.agent_id, session_id=self.session_id
        )
        for r in results:
            logger.info("memory write-back: %s %s %s", r.action, r.id or "", r.reason)

    def tools(self) -> list[Any]:
        return list(
            memory_tools(
                self.store,
                user_id=self.user_id,
                agent_id=self.agent_id,
                session_id=self.session_id,
            )
        )


def open_store(path: str | Path | None = None) -> AsyncMemoryStore:
    """The default store: ``LOOPSTACK_MEMORY_URL`` or ``$LOOPSTACK_HOME/memory`` (settings decide:
    ``LOOPSTACK_MEMORY_EMBEDDER=auto``: offline multilingual-e5 for a new store, an existing
    store's own model otherwise)."""
    return AsyncMemoryStore(path)
