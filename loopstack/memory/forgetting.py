"""Forgetting, as the store carries it out: a user's request (one record and the chain it
superseded, or every record matching a text) and the decay of unused records on a schedule.

Forgotten records stay in the ledger as tombstones (``[forgotten]``, a ``forgotten`` event),
so ``history`` still shows the supersede chain; decayed ones lose weight by half-life and the
faded non-explicit ones are pruned. Each function runs in a worker thread under the store's
write lock (``loopstack.memory.store.AsyncMemoryStore`` holds it); after every change the index
replica replays the ledger and persists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from loopstack.memory.config import MemorySettings
from loopstack.memory.exceptions import NotFoundError
from loopstack.memory.language import about_former, covers
from loopstack.memory.ledger.backend import LedgerBackend
from loopstack.memory.ledger.rows import FORGOTTEN
from loopstack.memory.records import Candidate
from loopstack.memory.replica import IndexReplica

__all__ = ["decay_now", "decay_schedule", "forget_chain", "matching_ids"]

logger = logging.getLogger(__name__)


def forget_chain(
    ledger: LedgerBackend, replica: IndexReplica, record_id: str, user_id: str
) -> list[str]:
    """Tombstone the record and its predecessors; [] when it was forgotten already."""
    with ledger.write() as tx:
        tx.lock_scope(user_id)
        rec = tx.get(record_id)
        if rec is None or rec.user_id != user_id:
            raise NotFoundError(f"no record {record_id} for this user")
        if rec.superseded_by == FORGOTTEN:
            return []  # forgotten already
        doomed = [rec, *ledger.predecessors(rec.id)]
        tx.tombstone(doomed, "forgotten at the user's request")
    replica.catch_up()
    replica.persist()
    return [r.id for r in doomed]


def matching_ids(candidates: Sequence[Candidate], text: str, min_similarity: float) -> list[str]:
    """The recalled records a forget request names: hybrid relevance at least
    ``min_similarity``, or, for a Chinese target (no keyword side for CJK), text covered; and
    for a target about a former thing ("my previous address", "前公司"), only records that
    say it was a former one (``about_former``: the current address stays)."""
    return [
        c.id
        for c in candidates
        if (c.relevance >= min_similarity or covers(c.text, text)) and about_former(c.text, text)
    ]


def decay_now(
    ledger: LedgerBackend, replica: IndexReplica, settings: MemorySettings, now: float
) -> dict[str, int]:
    """Decay to ``now`` and prune; ``decayed`` counts the records whose weight changed."""
    s = settings
    decayed, doomed = ledger.decay(
        now, s.decay_half_life_days, s.prune_below_weight, s.explicit_weight_floor
    )
    ledger.delete(doomed)
    replica.catch_up()
    replica.persist()
    return {"decayed": decayed, "pruned": len(doomed)}


def decay_schedule(
    ledger: LedgerBackend,
    settings: MemorySettings,
    now: float,
    run: Callable[[float], dict[str, int]],
) -> float:
    """The decay schedule: `run` decay when the last run (``decayed_at`` in the ledger's meta,
    shared by every server of a Postgres ledger) is ``decay_every_hours`` old. A store that
    never ran one starts its clock (``decay_clock``) instead: a new store has nothing to
    decay. Returns when the schedule is next checked (``inf`` when decay is off); decay is
    upkeep, so a failure is logged, never raised."""
    every = settings.decay_every_hours * 3600.0
    if every <= 0:
        return float("inf")
    next_check = now + every  # retried no sooner than this, whatever happens below
    try:
        last = ledger.get_meta("decayed_at") or ledger.get_meta("decay_clock")
        if last is None:
            ledger.set_meta("decay_clock", repr(now))
        elif now - float(last) >= every:
            logger.info("memory decay (scheduled): %s", run(now))
        else:
            next_check = float(last) + every
    except Exception as exc:  # decay is upkeep: it never fails an open or a write-back
        logger.warning("scheduled memory decay failed: %s", exc)
    return next_check
