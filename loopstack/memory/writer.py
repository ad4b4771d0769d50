"""``RecordWriter``: the store's write path, every decision inside one ledger transaction.

Duplicate, supersede and confirm decisions are taken on the writer's own snapshot after
``BEGIN IMMEDIATE``: no other thread or process can commit in between, so two processes
adding the same text cannot both insert it, and a ``kill -9`` can never leave a new version
committed without the supersede of the old one (they commit together or not at all).

The rules (docs/memory.md, "Write rules"):

* **Duplicate**: the same normalised text, or cosine >= ``duplicate_similarity`` with at
  most one word added or dropped (never a changed value): the existing record counts one
  more mention, and if the restatement is better backed (evidence, or the user saying it)
  the record is **confirmed**: it gains that evidence and a ``confirmed`` history event.
* **Supersede** (one rule, ``on_conflict="supersede"``): a new record supersedes an active
  one of the same user when both state the **same subject with a different value**
  (:func:`loopstack.memory.writeback.conflicting_value`: the texts share their frame and differ in
  one short span, or by a negation; or :func:`loopstack.memory.writeback.updates_subject`: the new
  one says the subject's value changed, "moved to", "now works at", "changed to", "no longer") and
  the older one is at least ``supersede_similarity`` close. An unverified record never supersedes a
  verified one: it is stored beside it and both get a history event. ``on_conflict="keep"`` turns
  superseding off for one ``add``. An explicit update (the second test) needs only
  ``update_similarity``: "I work at Acme" / "I now work at Globex".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import faiss
import numpy as np

from loopstack.memory.config import MemorySettings
from loopstack.memory.embedding import Vectors
from loopstack.memory.exceptions import NotFoundError, RedactedError
from loopstack.memory.index import shard_name
from loopstack.memory.ledger.backend import LedgerBackend, LedgerTx
from loopstack.memory.ledger.rows import NewRecord
from loopstack.memory.records import MemorySource, MemoryType, Record, Scope
from loopstack.memory.replica import IndexReplica
from loopstack.memory.trust import UNCHECKED, USER_CONFIRMED, provenance
from loopstack.memory.writeback import (
    conflicting_value,
    fingerprint,
    only_redactions,
    redact,
    same_content,
    updates_subject,
)

__all__ = ["OnConflict", "RecordWriter", "new_records", "storable_texts", "supersede_rule"]

logger = logging.getLogger(__name__)

OnConflict = Literal["supersede", "keep"]
_NEIGHBOURS = 8
_CHUNK = 2_000  # rowids per read (SQLite binds at most 32,766 parameters)


def as_record(item: NewRecord) -> Record:
    """A not-yet-written record, for trust and provenance decisions."""
    return Record(
        id=item.id or "new",
        scope=item.scope,
        text=item.text,
        type=item.type,
        source=item.source,
        confidence=item.confidence,
        weight=item.weight,
        evidence=list(item.evidence),
        mentions=item.mentions,
    )


@dataclass(slots=True)
class _Pending:
    """An item of this batch that will be inserted, with what it replaces."""

    item: NewRecord
    vec: Vectors
    replaces: list[Record | int]  # active records, or indexes of earlier pending items


class _Batch:
    """The pending items of one ``add``: by fingerprint, and a small in-memory HNSW index of
    their vectors, so each new item is compared with its nearest pending neighbours only
    (an ``add_many`` of n items costs O(n log n), not O(n^2))."""

    def __init__(self, dim: int) -> None:
        self.items: list[_Pending] = []
        self.by_fp: dict[tuple[str, str], int] = {}
        self.dim = dim
        self._index: faiss.IndexHNSWFlat | None = None

    def neighbours(self, vec: Vectors, k: int) -> list[tuple[int, float]]:
        if not self.items:
            return []
        if len(self.items) <= 4 * k:  # small batches: exact, every item
            sims = np.stack([p.vec for p in self.items]) @ vec
            return [(j, float(sims[j])) for j in np.argsort(-sims)[:k]]
        if self._index is None:
            self._index = faiss.IndexHNSWFlat(self.dim, 16, faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efSearch = 64
            self._index.add(np.stack([p.vec for p in self.items]).astype(np.float32))
        sims, ids = self._index.search(vec[None, :].astype(np.float32), k)
        return [(int(j), float(s)) for j, s in zip(ids[0], sims[0], strict=True) if j >= 0]

    def append(self, p: _Pending) -> int:
        self.items.append(p)
        self.by_fp.setdefault((p.item.scope.user_id, p.item.fingerprint), len(self.items) - 1)
        if self._index is not None:
            self._index.add(p.vec[None, :].astype(np.float32))
        return len(self.items) - 1


class _Committed:
    """The committed records the decisions of one ``add`` compare with, read up front: one
    query for the items' fingerprints and one per ``_CHUNK`` neighbour rowids, instead of
    two reads per item (on Postgres, two network round trips per item of a bulk add).

    As exact as reading them item by item: nothing in the decision loop inserts or
    supersedes (that comes after it), so which records are active does not change; a
    restatement does change its record (mentions, evidence, confidence), so a restated
    record is read again from the transaction when a later item meets it.
    """

    def __init__(
        self, tx: LedgerTx, replica: IndexReplica, items: list[NewRecord], vecs: Vectors
    ) -> None:
        self.tx = tx
        self.recs: dict[str, Record] = {}
        self.stale: set[str] = set()
        user = items[0].scope.user_id
        found = tx.by_fingerprints(user, sorted({i.fingerprint for i in items}))
        self.by_fp = {fp: self._keep(rec) for fp, rec in found.items()}
        shard = shard_name(user)
        self.hits = [
            []
            if item.fingerprint in self.by_fp
            else replica.index.search(shard, vec[None, :], _NEIGHBOURS)
            for item, vec in zip(items, vecs, strict=True)
        ]
        rowids = sorted({r for hits in self.hits for r, _ in hits})
        self.by_rowid: dict[int, str] = {}
        for k in range(0, len(rowids), _CHUNK):
            for rowid, rec in tx.active(rowids[k : k + _CHUNK], user).items():
                self.by_rowid[rowid] = self._keep(rec)

    def _keep(self, rec: Record) -> str:
        self.recs[rec.id] = rec
        return rec.id

    def _get(self, record_id: str) -> Record:
        if record_id in self.stale:
            fresh = self.tx.get(record_id)
            if fresh is not None:
                self.recs[record_id] = fresh
            self.stale.discard(record_id)
        return self.recs[record_id]

    def by_fingerprint(self, fingerprint: str) -> Record | None:
        rid = self.by_fp.get(fingerprint)
        return None if rid is None else self._get(rid)

    def neighbours(self, i: int) -> list[tuple[Record, float]]:
        """The active records nearest to item ``i`` (index order, best first)."""
        return [(self._get(self.by_rowid[r]), s) for r, s in self.hits[i] if r in self.by_rowid]

    def changed(self, record_id: str) -> None:
        self.stale.add(record_id)


def supersedes_value(old: str, new: str) -> bool:
    """Whether ``new`` states a newer value of ``old``'s subject (either test)."""
    return conflicting_value(old, new) or updates_subject(old, new)


def supersede_rule(old: str, new: str, similarity: float, settings: MemorySettings) -> bool:
    """The supersede rule with its cosine floors: the same subject with a different value
    (``supersede_similarity``) or an explicit update of the subject (``update_similarity``).
    The writer applies it to every add; write-back asks it of a plain self-statement."""
    return (similarity >= settings.supersede_similarity and conflicting_value(old, new)) or (
        similarity >= settings.update_similarity and updates_subject(old, new)
    )


class RecordWriter:
    """Sync (worker-thread) executor of adds; the store serialises calls with its lock."""

    def __init__(
        self, ledger: LedgerBackend, replica: IndexReplica, settings: MemorySettings
    ) -> None:
        self.ledger, self.replica, self.settings = ledger, replica, settings
        #: What the last ``add`` superseded: new id -> the ids it replaced (read it under the
        #: store's write lock, as write-back does, to report a supersede).
        self.last_superseded: dict[str, list[str]] = {}

    def add(
        self,
        items: list[NewRecord],
        vecs: Vectors,
        *,
        check: bool = True,
        supersedes: str | None = None,
        on_conflict: OnConflict = "supersede",
    ) -> list[str]:
        """Insert ``items`` (one transaction); returns one id per item (an existing id for a
        duplicate)."""
        out: list[str | int] = []
        self.last_superseded = {}
        superseded: dict[str, list[str]] = {}
        batch = _Batch(int(vecs.shape[1]) if len(vecs) else 1)
        pending = batch.items
        with self.ledger.write() as tx:
            tx.lock_scope(items[0].scope.user_id)  # Postgres: serialise with other servers
            # Under the write lock nobody can commit: after this replay (complete even when
            # another process trimmed the change log, see IndexReplica.catch_up) the index
            # holds exactly the ledger's active records, so the neighbour search below takes
            # its duplicate/supersede candidates from the committed state (issue #10).
            self.replica.catch_up()
            known = _Committed(tx, self.replica, items, vecs) if check else None
            for i, (item, vec) in enumerate(zip(items, vecs, strict=True)):
                out.append(self._decide(tx, item, vec, batch, known, i, on_conflict))
            if supersedes is not None and pending:
                target = tx.get(supersedes)
                if target is None or target.user_id != items[0].scope.user_id:
                    raise NotFoundError(f"no record {supersedes} for this user")
                if target.superseded_by is None:
                    pending[0].replaces.append(target)
            inserted = (
                tx.insert([p.item for p in pending], np.stack([p.vec for p in pending]))
                if pending
                else []
            )
            # Items of this batch that later ones replace: read back in one go (all active).
            mine = sorted(
                {inserted[o][1] for p in pending for o in p.replaces if not isinstance(o, Record)}
            )
            fresh: dict[int, Record] = {}
            for k in range(0, len(mine), _CHUNK):
                fresh.update(tx.active(mine[k : k + _CHUNK], items[0].scope.user_id))
            done: set[str] = set()
            for j, p in enumerate(pending):
                new_id = inserted[j][0]
                for old in p.replaces:
                    rec = old if isinstance(old, Record) else fresh.get(inserted[old][1])
                    if rec is None or rec.id in done or rec.id == new_id:
                        continue
                    done.add(rec.id)
                    tx.supersede(rec, new_id, f"contradicted by {new_id}: {p.item.text[:80]}")
                    superseded.setdefault(new_id, []).append(rec.id)
                    logger.info("%s supersedes %s", new_id, rec.id)
        self.last_superseded = superseded  # committed
        self.replica.catch_up()
        self.replica.persist()
        return [r if isinstance(r, str) else inserted[r][0] for r in out]

    def _decide(
        self,
        tx: LedgerTx,
        item: NewRecord,
        vec: Vectors,
        batch: _Batch,
        known: _Committed | None,
        i: int,
        on_conflict: OnConflict,
    ) -> str | int:
        """Duplicate (returns the existing id) or a new pending record (returns its index)."""
        s = self.settings
        replaces: list[Record | int] = []
        if known is not None:
            user = item.scope.user_id
            same = batch.by_fp.get((user, item.fingerprint))
            if same is not None:
                return same
            dup = known.by_fingerprint(item.fingerprint)
            neighbours = [] if dup is not None else known.neighbours(i)
            for old, sim in neighbours:
                if (
                    sim >= s.duplicate_similarity
                    and same_content(old.text, item.text)
                    and not conflicting_value(old.text, item.text)
                ):
                    dup = old
                    break
            if dup is not None:
                self._restate(tx, dup, item)
                known.changed(dup.id)
                return dup.id
            if on_conflict == "supersede":
                new = as_record(item)
                floor = min(s.supersede_similarity, s.update_similarity)
                cands: list[tuple[Record | int, Record, float]] = [
                    (old, old, sim) for old, sim in neighbours
                ]
                cands += [
                    (j, as_record(batch.items[j].item), sim)
                    for j, sim in batch.neighbours(vec, _NEIGHBOURS)
                    if sim >= floor and batch.items[j].item.scope.user_id == user
                ]
                for ref, old, sim in cands:
                    if not supersede_rule(old.text, item.text, sim, s):
                        continue
                    if self._may_supersede(new, old):
                        replaces.append(ref)
                    elif isinstance(old, Record) and old.rowid:
                        tx.event(
                            old.id,
                            "conflict_kept",
                            f"an unverified record said otherwise: {item.text[:80]}",
                        )
        return batch.append(_Pending(item, vec, replaces))

    def _may_supersede(self, new: Record, old: Record) -> bool:
        """Newer wins, except that an unverified claim never replaces a verified record."""
        k = self.settings.promote_after
        return provenance(new, k) != "unverified" or provenance(old, k) == "unverified"

    def _restate(self, tx: LedgerTx, old: Record, item: NewRecord) -> None:
        """A restatement: one more mention; a confirmation when it is better backed."""
        tx.bump_mentions(old.id, weight=item.weight)
        k = self.settings.promote_after
        extra = [e for e in item.evidence if e not in old.evidence and not e.startswith(UNCHECKED)]
        by_user = item.source == MemorySource.USER_EXPLICIT and provenance(old, k) != "user_said"
        if by_user:
            extra.append(USER_CONFIRMED)
        if extra:
            what = "the user" if by_user else "evidence " + ", ".join(extra[:4])
            tx.confirm(old, extra, item.confidence, f"confirmed by {what}")


def storable_texts(texts: Sequence[str]) -> list[str]:
    """The texts with their secrets redacted; a text that is nothing but a secret raises
    :class:`RedactedError` (and nothing of the batch is written)."""
    clean: list[str] = []
    for text in texts:
        red, kinds = redact(text.strip())
        if not red or (kinds and only_redactions(red)):
            raise RedactedError("nothing left to store after removing secrets")
        clean.append(red)
    return clean


def new_records(
    texts: Sequence[str],
    scope: Scope,
    type: MemoryType,
    source: MemorySource,
    confidence: float,
    weight: float,
    evidence: Sequence[str] | None,
    created_at: Sequence[float] | None,
    mentions: int,
) -> list[NewRecord]:
    """One record per (redacted) text, all of one scope; evidence ids redacted too;
    ``created_at`` one per text, else now."""
    now = time.time()
    proofs = [redact(e)[0] for e in evidence or []]
    return [
        NewRecord(
            scope=scope,
            text=t,
            type=type,
            source=source,
            confidence=confidence,
            weight=weight,
            evidence=list(proofs),
            fingerprint=fingerprint(t),
            created_at=created_at[i] if created_at is not None else now,
            mentions=mentions,
        )
        for i, t in enumerate(texts)
    ]
