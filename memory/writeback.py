"""Write-back: what deserves keeping after a turn, cleaned of secrets.

The promotion gate (``plan_turn``) turns one finished turn into proposals:

* explicit "remember ..." from the user - always stored, high weight;
* a user correction ("actually ...", "no, it's ...") - stored, and it supersedes the
  closest older record;
* a task conclusion - stored with source ``task``; a conclusion that claims facts without
  evidence is stored with low weight, so a poisoned tool result cannot become a "fact";
* plain self-statements ("I live in ...", "my ...") - only *observed*; one becomes a
  record once it was seen ``promote_after`` (3) times;
* a forget request ("don't remember my card number") - deletes matching records;
* anything the optional model distilled (``memory.llm``), through the same rules.

``redact`` runs on every text before it is embedded, stored or sent to the model.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memory.exceptions import ModelError, RedactedError, RejectedError
from memory.records import DistilledMemory, MemorySource, MemoryType, Turn, WriteResult

if TYPE_CHECKING:
    from memory.store import AsyncMemoryStore

__all__ = [
    "Proposal",
    "apply_turn",
    "fingerprint",
    "forget_request",
    "plan_turn",
    "redact",
]

logger = logging.getLogger(__name__)

# --- redaction ---------------------------------------------------------------------------

_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_SECRET_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("api_key", re.compile(r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9_-]{2,}-)?[A-Za-z0-9_-]{16,}\b")),
    ("api_key", re.compile(r"\b(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}\b")),
    ("api_key", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("api_key", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b")),
    (
        "private_key",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
        ),
    ),
    (
        "password",
        re.compile(
            r"(?i)\b(pass(?:word|wd|phrase)?|pwd|pin(?: code)?|secret|token|api[ _-]?key)"
            r"(\s*(?:is|was|=|:)\s*)([\"']?)(\S{3,})\3"
        ),
    ),
    (
        "password",
        # "password hunter2!": a bare value right after the word, if it looks like one
        re.compile(r"(?i)\b(pass(?:word|wd|phrase)?|pwd)(\s+)()(?=\S*[^\sA-Za-z])(\S{4,})"),
    ),
    ("iban", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b")),
]


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def redact(text: str) -> tuple[str, list[str]]:
    """Replace obvious secrets with ``[REDACTED:<kind>]``; returns (text, kinds found).

    Card numbers are matched by shape (13-19 digits, spaces/dashes allowed) *and* the Luhn
    checksum, so ordinary long numbers survive.
    """
    kinds: list[str] = []

    def card(m: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", m.group(0))
        if 13 <= len(digits) <= 19 and _luhn_ok(digits):
            kinds.append("card_number")
            return "[REDACTED:card_number]"
        return m.group(0)

    out = _CARD.sub(card, text)
    for kind, pattern in _SECRET_PATTERNS:
        if kind == "password":

            def pw(m: re.Match[str]) -> str:
                kinds.append("password")
                return f"{m.group(1)}{m.group(2)}[REDACTED:password]"

            out = pattern.sub(pw, out)
        else:
            new = pattern.sub(f"[REDACTED:{kind}]", out)
            if new != out:
                kinds.append(kind)
            out = new
    return out, kinds


def only_redactions(text: str) -> bool:
    """True when, without the redaction markers, no real content is left."""
    rest = re.sub(r"\[REDACTED:[a-z_]+\]", " ", text)
    words = re.findall(r"[^\W_]{2,}", rest)
    return len(words) < 2


# --- fingerprints ------------------------------------------------------------------------

_FILLER = re.compile(
    r"^(?:(?:please|pls|kindly|also|and|so|ok|okay|btw|by the way|fyi|note that|just)\s+)+",
    re.I,
)


def fingerprint(text: str) -> str:
    """Normalised text for exact-duplicate detection (case, punctuation, spaces)."""
    words = re.findall(r"[^\W_]+", text.lower())
    return " ".join(words)


def same_content(a: str, b: str) -> bool:
    """Near-duplicate guard on top of cosine: the texts may differ by at most one word and
    never by a number (cosine rates "standup at 9am" and "at 10am" as near-identical)."""
    wa, wb = set(fingerprint(a).split()), set(fingerprint(b).split())
    diff = wa ^ wb
    return len(diff) <= 2 and not any(ch.isdigit() for w in diff for ch in w)


# --- detectors ---------------------------------------------------------------------------

_EXPLICIT = re.compile(
    r"(?i)\b(?:please\s+)?(?:remember|memori[sz]e|keep in mind|don'?t forget|note)"
    r"(?:\s+(?:that|this|:))?\s*[:,-]?\s*(?P<body>.+)"
)
_CORRECTION = re.compile(
    r"(?i)^\s*(?:actually|correction|no|nope|wrong|i meant|to correct myself|that'?s not right)"
    r"\b[\s,:;.!-]*(?:it'?s\s+|it is\s+)?(?P<body>.+)"
)
_FORGET = re.compile(
    r"(?i)\b(?:don'?t|do not|never)\s+(?:remember|store|keep|save)\s+(?P<a>.+)"
    r"|\bforget\s+(?:about\s+)?(?:that\s+)?(?P<b>.+)"
    r"|\b(?:delete|remove|erase)\s+(?:the\s+)?(?:memory|memories)\s+(?:of|about)\s+(?P<c>.+)"
)
_SELF = re.compile(
    r"(?i)^(?:i\s+(?:am|'m|live|work|have|prefer|like|love|hate|use|own|was born|moved)|"
    r"my\s+\w+|we\s+(?:use|prefer|always|never))\b"
)
_LEAD = re.compile(
    r"(?i)^(?:(?:well|so|yeah|yes|also|btw|by the way|oh|and|anyway|hi|hey)\b[,!\s]*)+"
)
_CLAIM = re.compile(
    r"(?i)\b(?:is|are|was|were|has|have|will|costs?|equals?|located|founded|born)\b"
)


def _clean(body: str) -> str:
    body = body.strip().strip(" .!\"'")
    body = _FILLER.sub("", body)
    return body[:1].upper() + body[1:] if body else body


def explicit_request(message: str) -> str | None:
    if forget_request(message):
        return None
    m = _EXPLICIT.search(message)
    return _clean(m.group("body")) if m else None


def correction(message: str) -> str | None:
    m = _CORRECTION.match(message)
    return _clean(m.group("body")) if m and len(m.group("body").split()) >= 2 else None


def forget_request(message: str) -> str | None:
    """What the user asked to forget, or None."""
    m = _FORGET.search(message)
    if not m:
        return None
    body = m.group("a") or m.group("b") or m.group("c") or ""
    body = re.sub(r"(?i)^(?:my|the|that|this|about)\s+", "", body.strip().strip(" .!"))
    return body or None


def self_statements(message: str) -> list[str]:
    """Sentences where the user states something about themselves."""
    sentences = [_LEAD.sub("", s.strip()) for s in re.split(r"(?<=[.!?])\s+|\n+", message)]
    return [_clean(s) for s in sentences if _SELF.match(s) and len(s.split()) >= 3]


def _grounded(text: str, message: str, min_overlap: float = 0.6) -> bool:
    """Whether most content words of ``text`` occur in the user's ``message``."""
    skip = {"user", "users", "s", "the", "a", "an", "is", "are", "was", "has", "have", "their"}
    words = {w for w in re.findall(r"[^\W_]+", text.lower()) if w not in skip}
    said = set(re.findall(r"[^\W_]+", message.lower()))
    return bool(words) and len(words & said) / len(words) >= min_overlap


def claims_fact(text: str) -> bool:
    return bool(_CLAIM.search(text))


@dataclass(slots=True)
class Proposal:
    """One thing the gate wants done."""

    kind: str  # explicit | correction | conclusion | observation | distilled | forget
    text: str
    type: MemoryType = MemoryType.FACT
    source: MemorySource = MemorySource.USER_EXPLICIT
    confidence: float = 1.0
    evidence: list[str] = field(default_factory=list)
    supersede: bool = False
    weight: float | None = None


def plan_turn(
    turn: Turn,
    *,
    distilled: list[DistilledMemory] | None = None,
    explicit_weight: float = 2.0,
    unsupported_weight: float = 0.3,
) -> list[Proposal]:
    """The promotion gate's decisions for one turn (pure: no I/O)."""
    out: list[Proposal] = []
    msg = turn.user_message.strip()
    if msg:
        if (target := forget_request(msg)) is not None:
            out.append(Proposal("forget", target))
        elif (body := explicit_request(msg)) is not None:
            out.append(Proposal("explicit", body, weight=explicit_weight))
        elif (body := correction(msg)) is not None:
            out.append(Proposal("correction", body, supersede=True, weight=explicit_weight))
        else:
            for s in self_statements(msg):
                mtype = (
                    MemoryType.PREFERENCE
                    if re.search(r"(?i)\b(prefer|like|love|hate)\b", s)
                    else MemoryType.FACT
                )
                out.append(Proposal("observation", s, type=mtype, source=MemorySource.INFERRED))
    if turn.task_conclusion and turn.task_conclusion.strip():
        text = turn.task_conclusion.strip()
        supported = bool(turn.evidence) or not claims_fact(text)
        out.append(
            Proposal(
                "conclusion",
                text,
                type=MemoryType.DECISION,
                source=MemorySource.TASK,
                confidence=0.8 if supported else 0.4,
                evidence=list(turn.evidence),
                weight=None if supported else unsupported_weight,
            )
        )
    for d in distilled or []:
        if d.source == MemorySource.USER_EXPLICIT and not _grounded(d.text, msg):
            # The model may only call it explicit when the user said it; otherwise inferred.
            source = MemorySource.INFERRED
        else:
            source = d.source
        has_evidence = bool(turn.evidence) or source == MemorySource.USER_EXPLICIT
        out.append(
            Proposal(
                "distilled",
                d.text,
                type=d.type,
                source=source,
                confidence=d.confidence,
                evidence=list(turn.evidence),
                weight=None if has_evidence or not claims_fact(d.text) else unsupported_weight,
            )
        )
    return out


# --- executing the plan ------------------------------------------------------------------

_OBSERVATION_MATCH = 0.9


async def apply_turn(
    store: AsyncMemoryStore,
    turn: Turn,
    *,
    user_id: str,
    agent_id: str | None = None,
    session_id: str | None = None,
    distill: bool = True,
) -> list[WriteResult]:
    """Run the promotion gate on ``turn`` and carry out its decisions on ``store``."""
    s = store.settings
    # Secrets never reach the model, the embedder or the ledger.
    turn = Turn(
        user_message=redact(turn.user_message)[0],
        assistant_message=redact(turn.assistant_message)[0],
        task_conclusion=None if turn.task_conclusion is None else redact(turn.task_conclusion)[0],
        evidence=list(turn.evidence),
    )
    distilled: list[DistilledMemory] = []
    if distill and store.model is not None:
        try:
            distilled = await store.model.distill(turn)
        except ModelError as exc:
            logger.warning("distillation failed, using rules only: %s", exc)
    proposals = plan_turn(
        turn,
        distilled=distilled,
        explicit_weight=s.explicit_weight,
        unsupported_weight=s.unsupported_weight,
    )
    scope = {"user_id": user_id, "agent_id": agent_id, "session_id": session_id}
    results: list[WriteResult] = []
    for p in proposals:
        try:
            results.append(await _carry_out(store, p, scope))
        except RejectedError as exc:
            results.append(WriteResult("rejected", reason=str(exc), text=p.text))
    return results


async def _carry_out(store: AsyncMemoryStore, p: Proposal, scope: dict[str, Any]) -> WriteResult:
    s = store.settings
    if p.kind == "forget":
        gone = await store.forget_matching(p.text, user_id=scope["user_id"])
        return WriteResult("forgotten", reason=f"{len(gone)} record(s)", text=p.text)
    observe = p.kind == "observation" or (
        p.kind == "distilled" and p.source == MemorySource.INFERRED and not p.evidence
    )
    if observe:
        return await _observe(store, p, scope)
    if p.kind == "correction":
        old = await store.recall(p.text, **scope, threshold=-1e9, budget_tokens=10**9)
        target = next((c for c in old.candidates if c.similarity >= 0.5), None)
        rid = await store.add(
            p.text,
            **scope,
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
    rid = await store.add(
        p.text,
        **scope,
        type=p.type,
        source=p.source,
        confidence=p.confidence,
        evidence=p.evidence,
        weight=s.default_weight if p.weight is None else p.weight,
    )
    why = (
        "low weight: claims facts without evidence" if p.weight == s.unsupported_weight else p.kind
    )
    return WriteResult("stored", rid, reason=why, text=p.text)


async def _observe(store: AsyncMemoryStore, p: Proposal, scope: dict[str, Any]) -> WriteResult:
    """Count a sighting; promote to a record on the ``promote_after``-th one."""
    s, user_id = store.settings, scope["user_id"]
    text, kinds = redact(p.text)
    if kinds and only_redactions(text):
        raise RedactedError("nothing left after removing secrets")
    await store.open()
    vec = (await store.embedder.embed([text]))[0]
    fp = fingerprint(text)
    known = await asyncio.to_thread(store.ledger.by_fingerprint, user_id, fp)
    if known is not None:
        await store.add(text, **scope, type=known.type, source=known.source)
        return WriteResult("duplicate", known.id, reason="already remembered", text=text)
    for ofp, _otext, _count, ovec in await asyncio.to_thread(store.ledger.observations, user_id):
        if ofp == fp or float(ovec @ vec) >= _OBSERVATION_MATCH:
            fp = ofp
            break
    count = await asyncio.to_thread(
        store.ledger.observe, user_id, fp, text, p.type, vec, time.time()
    )
    if count < s.promote_after:
        return WriteResult("observed", reason=f"seen {count}/{s.promote_after} times", text=text)
    await asyncio.to_thread(store.ledger.drop_observation, user_id, fp)
    rid = await store.add(
        text,
        **scope,
        type=p.type,
        source=MemorySource.INFERRED,
        confidence=0.7,
        weight=s.default_weight,
    )
    return WriteResult("promoted", rid, reason=f"repeated {count} times", text=text)
