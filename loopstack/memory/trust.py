"""How a memory is known (its *provenance*) and how far it is trusted.

Every record is known in one of four ways, derived from what the ledger holds:

* ``user_said`` - the user stated it (source ``user_explicit``, or a user confirmation);
* ``evidence`` - it is backed by named evidence (tool results or messages, ``evidence`` ids)
  that was checked: the write-back gate attaches an id to a conclusion only when the result it
  names contains what the conclusion asserts (``loopstack.memory.evidence``); an id memory could not
  check (a model's citation, a turn without the results' texts) is kept as ``unchecked:ID``
  and proves nothing. Ids handed to ``add``/``verify`` by the application are its word;
* ``repeated`` - inferred from the user restating it ``promote_after`` (3) times or more;
* ``unverified`` - anything else: a task conclusion or a model's claim with no evidence.

``trust`` turns that into 0..1: the provenance's prior scaled by the record's confidence
(``prior * (0.5 + 0.5 * confidence)``). Priors 1.0 / 0.9 / 0.75 / 0.3, so an unverified
record is never above 0.3 and the default trust floor (0.35) keeps it out of the
``<memory>`` block, while every verified kind stays above it at any confidence >= 0.
Gate 3 subtracts ``w_trust * (1 - trust)`` from the score (``w_trust`` 0.6, so an
unverified record loses at least 0.3 more than an evidence-backed one) and ranks every
record below the floor after every record at or above it, so an unverified record never
outranks a verified one, even when it is asked for (``include_unverified=True``).
"""

from __future__ import annotations

import re

from loopstack.memory.records import MemorySource, Provenance, Record

__all__ = [
    "PROVENANCE_PRIOR",
    "UNCHECKED",
    "USER_CONFIRMED",
    "Provenance",
    "proofs",
    "provenance",
    "provenance_label",
    "trust",
    "unchecked",
]

PROVENANCE_PRIOR: dict[Provenance, float] = {
    "user_said": 1.0,
    "evidence": 0.9,
    "repeated": 0.75,
    "unverified": 0.3,
}

#: The evidence id a user confirmation leaves on a record (see ``AsyncMemoryStore.verify``).
USER_CONFIRMED = "user:confirmed"
#: The prefix of an evidence id that memory could not check: kept for the record, no proof.
UNCHECKED = "unchecked:"


def unchecked(ref: str) -> str:
    """``ref`` marked as an id nobody checked (idempotent)."""
    return ref if ref.startswith(UNCHECKED) else UNCHECKED + ref


def proofs(rec: Record) -> list[str]:
    """The evidence ids that count as proof: neither a user confirmation nor unchecked."""
    return [e for e in rec.evidence if e != USER_CONFIRMED and not e.startswith(UNCHECKED)]


def provenance(rec: Record, promote_after: int = 3) -> Provenance:
    """How ``rec`` is known (see the module docstring)."""
    if rec.source == MemorySource.USER_EXPLICIT or USER_CONFIRMED in rec.evidence:
        return "user_said"
    if proofs(rec):
        return "evidence"
    if rec.source == MemorySource.INFERRED and rec.mentions >= promote_after:
        return "repeated"
    return "unverified"


def trust(rec: Record, promote_after: int = 3) -> float:
    """0..1: the provenance's prior scaled by the record's confidence."""
    conf = min(1.0, max(0.0, rec.confidence))
    return PROVENANCE_PRIOR[provenance(rec, promote_after)] * (0.5 + 0.5 * conf)


def _short(ref: str, limit: int = 40) -> str:
    # Evidence ids come from callers: only id-like characters reach the block.
    ref = re.sub(r"[^A-Za-z0-9_:#./@=-]+", "_", ref)
    return ref if len(ref) <= limit else ref[: limit - 1] + "…"


def provenance_label(rec: Record, promote_after: int = 3) -> str:
    """The compact form the ``<memory>`` block shows: ``user said``, ``evidence: tool:x#3``,
    ``repeated 3x`` or ``unverified``."""
    kind = provenance(rec, promote_after)
    if kind == "user_said":
        return "user confirmed" if rec.source != MemorySource.USER_EXPLICIT else "user said"
    if kind == "evidence":
        refs = proofs(rec)
        more = f" +{len(refs) - 2}" if len(refs) > 2 else ""
        return "evidence: " + ", ".join(_short(e) for e in refs[:2]) + more
    if kind == "repeated":
        return f"repeated {rec.mentions}x"
    return "unverified"
