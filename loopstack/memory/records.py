"""The data the package passes around: records, scopes, candidates and recall results.

Dataclasses inside the package; the pydantic models at the bottom (``RecordIn``,
``DistilledMemory``, ``Turn``) are the shapes accepted at the edges (CLI, tools, model).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loopstack.memory.exceptions import ScopeError

__all__ = [
    "Candidate",
    "DistilledMemory",
    "EventKind",
    "MemorySource",
    "MemoryType",
    "Provenance",
    "Recall",
    "Record",
    "RecordIn",
    "Scope",
    "TrustEvent",
    "Turn",
    "WriteAction",
    "WriteResult",
]


class MemoryType(StrEnum):
    FACT = "fact"
    PREFERENCE = "preference"
    DECISION = "decision"
    EPISODE = "episode"
    PROCEDURE = "procedure"


class MemorySource(StrEnum):
    USER_EXPLICIT = "user_explicit"
    TASK = "task"
    TOOL = "tool"
    INFERRED = "inferred"


#: How much a source is trusted, used by importance() in gate 3.
SOURCE_PRIOR: dict[MemorySource, float] = {
    MemorySource.USER_EXPLICIT: 1.0,
    MemorySource.TASK: 0.7,
    MemorySource.TOOL: 0.6,
    MemorySource.INFERRED: 0.4,
}


#: How a record is known; see ``loopstack.memory.trust``.
Provenance = Literal["user_said", "evidence", "repeated", "unverified"]
#: What a trust event did to a record (its history, next to the supersede chain).
EventKind = Literal["confirmed", "contradicted", "conflict_kept", "forgotten"]
WriteAction = Literal[
    "stored", "duplicate", "superseded", "observed", "promoted", "rejected", "forgotten"
]


@dataclass(frozen=True, slots=True)
class TrustEvent:
    """One change of a record's trust: confirmed by evidence or the user, or contradicted."""

    ts: float
    kind: EventKind
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Scope:
    """Who a record belongs to. ``user_id`` is mandatory; the others narrow it."""

    user_id: str
    agent_id: str | None = None
    session_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.user_id, str) or not self.user_id.strip():
            raise ScopeError("user_id is required and must be a non-empty string")


@dataclass(slots=True)
class Record:
    """One memory as the ledger stores it."""

    id: str
    scope: Scope
    text: str
    type: MemoryType = MemoryType.FACT
    source: MemorySource = MemorySource.USER_EXPLICIT
    confidence: float = 1.0
    created_at: float = field(default_factory=time.time)
    last_used_at: float | None = None
    hits: int = 0
    weight: float = 1.0
    superseded_by: str | None = None
    evidence: list[str] = field(default_factory=list)
    mentions: int = 1
    rowid: int = 0
    events: list[TrustEvent] = field(default_factory=list)

    @property
    def user_id(self) -> str:
        return self.scope.user_id

    @property
    def month(self) -> str:
        """``YYYY-MM`` of creation."""
        return datetime.fromtimestamp(self.created_at, tz=UTC).strftime("%Y-%m")

    @property
    def day(self) -> str:
        """``YYYY-MM-DD`` of creation, as rendered in the ``<memory>`` block (a month was
        not enough to tell which of two values of one subject is newer)."""
        return datetime.fromtimestamp(self.created_at, tz=UTC).strftime("%Y-%m-%d")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user_id": self.scope.user_id,
            "agent_id": self.scope.agent_id,
            "session_id": self.scope.session_id,
            "text": self.text,
            "type": self.type.value,
            "source": self.source.value,
            "confidence": self.confidence,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "hits": self.hits,
            "weight": self.weight,
            "superseded_by": self.superseded_by,
            "evidence": list(self.evidence),
            "mentions": self.mentions,
            "events": [e.to_dict() for e in self.events],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclass(slots=True)
class Candidate:
    """A record that reached gate 3, with every part of its score and the verdict."""

    record: Record
    similarity: float = 0.0
    keyword: float = 0.0
    relevance: float = 0.0  # the hybrid match: similarity + w_keyword * keyword (gate 3)
    importance: float = 0.0
    freshness: float = 0.0
    type_boost: float = 0.0
    score: float = 0.0
    tokens: int = 0
    provenance: Provenance = "unverified"
    trust: float = 0.0
    via: set[str] = field(default_factory=set)
    kept: bool = False
    reason: str = ""

    # Convenience accessors so ``Recall.items`` entries read like the contract says.
    @property
    def id(self) -> str:
        return self.record.id

    @property
    def text(self) -> str:
        return self.record.text

    def explain(self) -> dict[str, Any]:
        """A JSON-friendly line for traces: why this candidate was kept or dropped."""
        return {
            "id": self.record.id,
            "text": self.record.text,
            "type": self.record.type.value,
            "via": sorted(self.via),
            "similarity": round(self.similarity, 4),
            "keyword": round(self.keyword, 4),
            "importance": round(self.importance, 4),
            "freshness": round(self.freshness, 4),
            "type_boost": round(self.type_boost, 4),
            "provenance": self.provenance,
            "trust": round(self.trust, 4),
            "score": round(self.score, 4),
            "tokens": self.tokens,
            "kept": self.kept,
            "reason": self.reason,
        }


@dataclass(slots=True)
class Recall:
    """What the load pipeline returns: the block to inject and how it was chosen."""

    query: str
    items: list[Candidate]
    block: str
    candidates: list[Candidate]
    tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.items)

    def trace(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "tokens": self.tokens,
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
            "candidates": [c.explain() for c in self.candidates],
        }


@dataclass(slots=True)
class WriteResult:
    """Outcome of one write-back decision."""

    action: WriteAction
    id: str | None = None
    superseded: str | None = None
    reason: str = ""
    text: str = ""


# ---------------------------------------------------------------------------------------
# Edge models (pydantic)
# ---------------------------------------------------------------------------------------


class RecordIn(BaseModel):
    """A record as a caller (CLI, tool, HTTP) hands it in."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=4_000)
    type: MemoryType = MemoryType.FACT
    source: MemorySource = MemorySource.USER_EXPLICIT
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    evidence: list[str] = Field(default_factory=list, max_length=32)


class DistilledMemory(BaseModel):
    """The fixed schema the model distils a turn into (enforced by constrained decoding)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=500)
    type: MemoryType
    source: MemorySource
    confidence: float = Field(ge=0.0, le=1.0)


class Turn(BaseModel):
    """One finished agent turn offered to the write-back gate."""

    user_message: str = ""
    assistant_message: str = ""
    task_conclusion: str | None = None
    evidence: list[str] = Field(
        default_factory=list, description="ids of tool results / messages backing the turn"
    )
    observations: dict[str, str] = Field(
        default_factory=dict,
        description="the cited results' texts by evidence id: the gate checks a conclusion "
        "against them (loopstack.memory.evidence); ids without a text stay unchecked",
    )
