"""Carrying out the promotion gate's plan (``memory.writeback.plan_turn``) on a store.

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

from memory.config import MemorySettings
from memory.embedding import Embedder
from memory.exceptions import RedactedError
from memory.ledger.backend import LedgerBackend
from memory.records import MemorySource, MemoryType, Recall, Scope, WriteResult
from memory.trust import UNCHECKED
from memory.writeback import Proposal, fingerprint, only_redactions, redact

__all__ = ["WriteTarget", "execute"]

_OBSERVATION_MATCH = 0.9
_CORRECTION_MATCH = 0.5


class WriteTarget(Protocol):
    """What executing a plan needs from a store."""

    settings: MemorySettings
    embedder: Embedder

    @property
    def ledger(self) -> LedgerBackend: ...

    @property
    def add_many(self) -> Callable[..., Awaitable[list[str]]]: ...

    @property
    def recall(self) -> Callable[..., Awaitable[Recall]]: ...

    @property
    def _forget_matching(self) -> Callable[[str, str, float], Awaitable[Sequence[str]]]: ...


async def _add(store: WriteTarget, text: str, **kw: Any) -> str:
    return (await store.add_many([text], **kw))[0]


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
        sup = None if target is None else target.id
        return WriteResult("superseded" if sup else "stored", rid, sup, "user correction", p.text)
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
    return WriteResult("stored", rid, reason=why, text=p.text)


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
