"""Long-term memory for loopstack agents: a ledger (one SQLite file, or one Postgres database
shared by many app servers: ``loopstack.memory.ledger``) with FAISS recall in four gates.

Public contract::

    from loopstack.memory import MemoryStore
    store = MemoryStore(path)   # a SQLite path or a postgresql:// URL; AsyncMemoryStore: async
    rid = store.add("User prefers metric units", user_id="u1", type="preference")
    rec = store.recall("which units?", user_id="u1", budget_tokens=600)
    rec.items[0].id, rec.items[0].text, rec.items[0].score, rec.block
    store.forget(rid, user_id="u1"); store.history(rid)

``rec.block`` is framed by ``BLOCK_HEADER`` / ``BLOCK_FOOTER``; ``memory_tools(store, user_id=...)``
are the ``recall_memory`` and ``save_memory`` tools an agent mounts.
"""

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Embedder, EndpointEmbedder, HashingEmbedder, MiniLMEmbedder
from loopstack.memory.exceptions import LoopstackMemoryError
from loopstack.memory.index import VectorIndex
from loopstack.memory.pipeline import BLOCK_FOOTER, BLOCK_HEADER
from loopstack.memory.records import (
    Candidate,
    MemorySource,
    MemoryType,
    Provenance,
    Recall,
    Record,
    RecordIn,
    Scope,
    TrustEvent,
    Turn,
    WriteResult,
)
from loopstack.memory.store import AsyncMemoryStore
from loopstack.memory.sync import MemoryStore
from loopstack.memory.tools import memory_tools

__all__ = [
    "BLOCK_FOOTER",
    "BLOCK_HEADER",
    "AsyncMemoryStore",
    "Candidate",
    "Embedder",
    "EndpointEmbedder",
    "HashingEmbedder",
    "LoopstackMemoryError",
    "MemorySettings",
    "MemorySource",
    "MemoryStore",
    "MemoryType",
    "MiniLMEmbedder",
    "Provenance",
    "Recall",
    "Record",
    "RecordIn",
    "Scope",
    "TrustEvent",
    "Turn",
    "VectorIndex",
    "WriteResult",
    "memory_tools",
]
