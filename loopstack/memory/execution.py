"""Carrying out the promotion gate's plan (``loopstack.memory.writeback.plan_turn``) on a store.

``AsyncMemoryStore.write_back`` calls :func:`execute` for each proposal while it holds its
write lock; the store's own ``add`` recognises that and does not take the lock again. This
module depends on the :class:`WriteTarget` protocol, not on the store, so ``store`` imports
it and nothing here imports ``store`` (no import loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Embedder, Vectors
from loopstack.memory.exceptions import RedactedError
from loopstack.memory.index import ShardedIndex, shard_name
from loopstack.memory.ledger.backend import LedgerBackend
from loopstack.memory.records import MemorySource, MemoryType, Recall, Scope, WriteResult
from loopstack.memory.trust import UNCHECKED
from loopstack.memory.writeback import Proposal, fingerprint, only_redactions, redact
from loopstack.memory.writer import RecordWriter, supersede_rule

__all__ = ["WriteTarget", "execute"]

_OBSERVATION_MATCH = 0.9
_CORRECTION_MATCH = 0.5
_NEIGHBOURS = 8  # the records a restated value is checked against (the writer's own count)


class WriteTarget(Protocol):
    """What executing a plan needs from a store."""

    settings: MemorySettings
    embedder: Embedder

    @property
    def ledger(self) -> LedgerBackend: ...

    @property
    def writer(self) -> RecordWriter: ...

    @property
    def index(self) -> ShardedIndex: ...

    @property
    def add_many(self) -> Callable[..., Awaitable[list[str]]]: ...

    @property
    def recall(self) -> Callable[..., Awaitable[Recall]]: ...

    @property
    def _forget_matching(self) -> Callable[[str, str, float], Awaitable[Sequence[str]]]: ...


async def _add(store: WriteTarget, text: str, **kw: Any) -> str:
    return (await store.add_many([text], **kw))[0]


def _stored(store: WriteTarget, rid: str, reason: str, text: str) -> WriteResult:
    """The result of an add: ``superseded`` (naming the record it replaced) when the
    writer's supersede rule replaced one, else ``stored``."""
    replaced = store.writer.last_superseded.get(rid)
    if replaced:
        return WriteResult("superseded", rid, replaced[0], reason, text)
    return WriteResult("stored", rid, reason=reason, text=text)


def _scope_kw(scope: Scope) -> dict[str, Any]:
    return {"user_id": scope.user_id, "agent_id": scope.agent_id, "session_id": scope.session_id}


async def execute(store: WriteTarget, p: Proposal, scope: Scope) -> WriteResult:
    """Carry out one proposal; the caller holds the store's write lock."""
    s, kw = store.settings, _scope_kw(scope)
    if p.kind == "perishable":
        return WriteResult("rejected", reason="perishable: goes stale within a day", text=p.text)
    if p.kind == "forget":
        gone = await store._forget_matching(p.text, scope.user_id, 0.55)
        return WriteResult("forgotten", reason=f"{len(gone)} record(s)", text=p.text)
    observe = p.kind == "observation" or (
        p.kind == "distilled"
        and p.source == MemorySource.INFERRED
        and all(e.startswith(UNCHECKED) for e in p.evidence)
    )
    if observe:
        return await _observe(store, p, scope)
    if p.kind == "correction":
        old = await store.recall(
            p.text, **kw, threshold=-1e9, budget_tokens=10**9, include_unverified=True
        )
        target = next((c for c in old.candidates if c.similarity >= _CORRECTION_MATCH), None)
        rid = await _add(
            store,
            p.text,
            **kw,
            type=p.type,
            source=p.source,
            confidence=p.confidence,
            evidence=p.evidence,
            weight=p.weight,
            check_conflicts=target is None,
            supersedes=None if target is None else target.id,
        )
        if target is not None:
            return WriteResult("superseded", rid, target.id, "user correction", p.text)
        return _stored(store, rid, "user correction", p.text)
    rid = await _add(
        store,
        p.text,
        **kw,
        type=p.type,
        source=p.source,
        confidence=p.confidence,
        evidence=p.evidence,
        weight=s.default_weight if p.weight is None else p.weight,
    )
    why: str = (
        "low weight, unverified: claims facts without evidence"
        if p.weight == s.unsupported_weight
        else p.kind
    )
    if p.note:
        why = f"{why} ({p.note})"
    return _stored(store, rid, why, p.text)


async def _gives_new_value(store: WriteTarget, text: str, vec: Vectors, scope: Scope) -> bool:
    """Whether ``text`` states a new value of the subject of one of the active records of
    this scope nearest to it, by the writer's own rule (``loopstack.memory.writer.supersede_rule``).
    Straight from the index: no query rewrite, no recall usage counted."""
    hits = store.index.search(shard_name(scope.user_id), vec[None, :], _NEIGHBOURS)
    recs = await asyncio.to_thread(store.ledger.by_rowids, [r for r, _ in hits], scope)
    return any(
        supersede_rule(recs[r].text, text, sim, store.settings) for r, sim in hits if r in recs
    )


async def _observe(store: WriteTarget, p: Proposal, scope: Scope) -> WriteResult:
    """Count a sighting; promote to a record on the ``promote_after``-th one."""
    s, user_id, kw = store.settings, scope.user_id, _scope_kw(scope)
    text, kinds = redact(p.text)
    if kinds and only_redactions(text):
        raise RedactedError("nothing left after removing secrets")
    vec = (await store.embedder.embed([text]))[0]
    fp = fingerprint(text)
    ledger = store.ledger
    known = await asyncio.to_thread(ledger.by_fingerprint, user_id, fp)
    if known is not None:
        await _add(store, text, **kw, type=known.type, source=known.source)
        return WriteResult("duplicate", known.id, reason="already remembered", text=text)
    if await _gives_new_value(store, text, vec, scope):
        # "My sister moved to Porto." after "My sister lives in Lisbon": the user said it, so
        # it is stored as the user's words at once and the add's supersede rule replaces the
        # old value, exactly as ``add`` would (no waiting for three sightings).
        rid = await _add(
            store,
            text,
            **kw,
            type=p.type if isinstance(p.type, MemoryType) else MemoryType(p.type),
            source=MemorySource.USER_EXPLICIT,
            weight=s.default_weight,
        )
        return _stored(store, rid, "the user stated a new value of a known subject", text)
    for ofp, _otext, _count, ovec in await asyncio.to_thread(ledger.observations, user_id):
        if ofp == fp or float(ovec @ vec) >= _OBSERVATION_MATCH:
            fp = ofp
            break
    count = await asyncio.to_thread(ledger.observe, user_id, fp, text, p.type, vec, time.time())
    if count < s.promote_after:
        return WriteResult("observed", reason=f"seen {count}/{s.promote_after} times", text=text)
    await asyncio.to_thread(ledger.drop_observation, user_id, fp)
    rid = await _add(
        store,
        text,
        **kw,
        type=p.type if isinstance(p.type, MemoryType) else MemoryType(p.type),
        source=MemorySource.INFERRED,
        confidence=0.7,
        weight=s.default_weight,
        mentions=count,
    )
    return WriteResult("promoted", rid, reason=f"repeated {count} times", text=text)
