"""Write-back: what deserves keeping after a turn, cleaned of secrets.

The promotion gate (``plan_turn``) turns one finished turn into proposals:

* explicit "remember ..." from the user - always stored, high weight;
* a user correction ("actually ...", "no, it's ...") - stored, and it supersedes the
  closest older record;
* a task conclusion - stored with source ``task``, evidence-backed only when what it asserts
  is found in the results it cites (``loopstack.memory.evidence.check`` against
  ``Turn.observations``); otherwise unverified (low weight, trust below the injection floor), so a
  guess or a poisoned tool result cannot become a "fact"; a perishable one (weather, prices,
  "today", "目前") or trivial one ("Noted.", "OK", "Done.": ``trivial_reply``) is not stored at all;
* plain self-statements ("I live in ...", "my ...") - only *observed*; one becomes a
  record once it was seen ``promote_after`` (3) times;
* a forget request ("don't remember my card number") - deletes matching records;
* the same requests in Chinese ("记住...", "别忘了...", "其实...", "忘掉...":
  ``loopstack.memory.language``);
* anything the optional model distilled (``loopstack.memory.llm``), through the same rules.

``redact`` (``loopstack.memory.redaction``) runs on every text and evidence id before it is
embedded, stored or sent to the model. This module only plans (pure functions, no I/O);
``AsyncMemoryStore.write_back`` carries the plan out under its write lock
(``loopstack.memory.execution``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from loopstack.memory.evidence import check, perishable
from loopstack.memory.language import (
    zh_correction,
    zh_explicit_request,
    zh_forget_request,
    zh_self_statements,
)
from loopstack.memory.pipeline import STOPWORDS
from loopstack.memory.records import DistilledMemory, MemorySource, MemoryType, Turn
from loopstack.memory.redaction import only_redactions, redact
from loopstack.memory.trust import unchecked

__all__ = [
    "Proposal",
    "ProposalKind",
    "conflicting_value",
    "fingerprint",
    "forget_request",
    "only_redactions",
    "plan_turn",
    "redact",
    "redact_turn",
    "same_content",
    "trivial_reply",
    "updates_subject",
]

ProposalKind = Literal[
    "explicit", "correction", "conclusion", "observation", "distilled", "forget", "perishable"
]

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


_NEGATIONS = frozenset({"not", "no", "never", "don", "t", "doesn", "isn", "aren", "won", "didn"})
_FRAME_SKIP = frozenset({"a", "an", "the", "is", "are", "was", "to", "of", "in", "at", "on"})


def conflicting_value(old: str, new: str, *, max_value_words: int = 4) -> bool:
    """The supersede rule's test: same subject, different value.

    Both texts share a *frame* (their common leading and trailing words) with at least two
    words, one of them a content word, and differ only in one span of at most
    ``max_value_words`` words on each side, no longer than the frame ("My sister lives in
    Paris" / "... in Tokyo", "Standup is at 9am" / "... at 10am"), or by a negation alone
    ("I eat meat" / "I don't eat meat"). A mere addition ("... at 10am daily") is no
    conflict, and neither are two statements about different things.
    """
    a, b = fingerprint(old).split(), fingerprint(new).split()
    if a == b:
        return False
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    q = 0
    while q < min(len(a), len(b)) - p and a[-1 - q] == b[-1 - q]:
        q += 1
    da, db = a[p : len(a) - q], b[p : len(b) - q]
    frame = a[:p] + a[len(a) - q :]
    if len(frame) < 2 or not [w for w in frame if w not in _FRAME_SKIP]:
        return False
    if not da or not db:  # one side only adds words: a negation flips the value
        return bool(set(da or db) & _NEGATIONS) and len(da or db) <= 2
    return max(len(da), len(db)) <= min(max_value_words, len(frame))


# A predicate family: a newer statement of the same family about the same subject replaces
# the older one when it says so ("moved to", "now works at", "changed to", "no longer").
_FAMILIES = {
    "place": r"(?:lives?|living|lived|resides?|(?:is |are )?based|moved|moves|relocated)"
    r" (?:back )?(?:in|to)",
    "work": r"(?:works?|working|worked|employed) (?:at|for)|joined",
    "uses": r"(?:uses?|using|switched to|migrated to)",
    "value": r"(?:is|are|was) (?:now |at |on )*|(?:has |have )?changed (?:to|from)",
}
_PREDICATE = re.compile(r"\b(?:" + "|".join(f"(?P<{k}>{v})" for k, v in _FAMILIES.items()) + r")\b")
_UPDATE_CUE = re.compile(
    r"\b(?:moved|relocated|now|changed|switched|migrated|no longer|not any ?more|anymore|joined)\b"
)
_SUBJECT_SKIP = {"now", "no", "longer", "actually", "recently", "just", "also", "has", "have"}


def _subject_and_families(words: str) -> tuple[str, set[str]]:
    """The words before the first predicate (the subject) and every predicate family."""
    matches = list(_PREDICATE.finditer(words))
    if not matches:
        return "", set()
    head = [w for w in words[: matches[0].start()].split() if w not in _SUBJECT_SKIP]
    fams = {k for m in matches for k, v in m.groupdict().items() if v}
    return " ".join(head), fams


def updates_subject(old: str, new: str, *, max_subject_words: int = 5) -> bool:
    """The supersede rule's second test: ``new`` says that the value of ``old``'s subject
    changed. Both share their subject (the words before the first predicate: "my sister")
    and a predicate family (where someone lives, works, what they use, what something is),
    and ``new`` carries an update cue ("moved to", "now works at", "changed to", "no longer").
    "My sister moved to Porto last month and works there as a nurse." updates "My sister
    lives in Lisbon and works as a nurse."; "My brother moved to Porto", "My sister visited
    Porto" and "My sister now works at a clinic" do not."""
    a, b = fingerprint(old), fingerprint(new)
    if a == b or not _UPDATE_CUE.search(b):
        return False
    subj_a, fam_a = _subject_and_families(a)
    subj_b, fam_b = _subject_and_families(b)
    if not subj_a or subj_a != subj_b or len(subj_a.split()) > max_subject_words:
        return False
    return bool(fam_a & fam_b)


# --- detectors ---------------------------------------------------------------------------

_EXPLICIT = re.compile(
    r"(?i)\b(?:please\s+)?(?:remember|memori[sz]e|keep in mind|don'?t forget|note)"
    r"(?:\s+(?:that|this|:))?\s*[:,-]?\s*(?P<body>.+)"
)
_CORRECTION = re.compile(
    r"(?i)^\s*(?:actually|correction|no|nope|wrong|i meant|to correct myself|that'?s not right)"
    r"\b[\s,:;.!-]*(?:it'?s\s+|it is\s+)?(?P<body>.+)"
)
# A forget request is an imperative to the assistant, at the start of a sentence (after
# "please", "can you", "I want you to", ...): "forget X", "don't remember/store X",
# "delete the memory of X", "remove X from your memory". Never "don't forget X", "I forgot",
# "forget to ...", "forget it", "I don't remember ...": see docs/memory.md.
_LEAD_IN = (
    r"^(?:(?:please|pls|kindly|ok(?:ay)?|hey|hi|so|and|also|now|oh|just|actually|alright)"
    r"\b[,!\s]*)*"
    r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?"
    r"|i(?:\s+want|\s+need|\s+would\s+like|'d\s+like)\s+you\s+to\s+"
    r"|you\s+(?:can|should|may|must|need\s+to)\s+(?:now\s+)?)?(?:please\s+|just\s+)?"
)
_STORE_OBJECT = r"(?=(?:my|that|this|it|anything|any|what|those|these|the\s+fact)\b)"
_FORGET = [
    re.compile(
        _LEAD_IN + r"forget\s+(?!to\b|(?:it|that|this)\s*(?:[,.!?;]|$))"
        r"(?:all\s+)?(?:about\s+)?(?:the\s+fact\s+)?(?:that\s+)?(?P<body>.+)",
        re.I,
    ),
    re.compile(
        _LEAD_IN + r"(?:don'?t|do\s+not|never|stop)\s+(?:remember(?:ing)?\s+"
        r"|(?:stor|sav|keep|record|track)(?:e|ing)?\s+" + _STORE_OBJECT + r")(?P<body>.+)",
        re.I,
    ),
    re.compile(
        _LEAD_IN + r"(?:delete|remove|erase|wipe|purge|clear|drop)\s+(?:all\s+)?"
        r"(?:the\s+|my\s+|your\s+|any\s+)?(?:memory|memories|notes?|records?)\s+"
        r"(?:of|about|on|for|saying|that)\s+(?P<body>.+)",
        re.I,
    ),
    re.compile(
        _LEAD_IN + r"(?:delete|remove|erase|wipe|purge|clear|drop)\s+(?P<body>.+?)\s+"
        r"(?:from|out\s+of)\s+(?:your\s+|the\s+|my\s+)?memor(?:y|ies)\b",
        re.I,
    ),
    re.compile(
        _LEAD_IN + r"(?:delete|remove|erase|wipe|purge|clear|forget)\s+(?:what|everything|"
        r"anything|all)\s+(?:that\s+)?you\s+(?:know|remember|stored|saved|have(?:\s+stored|"
        r"\s+saved|\s+on\s+file)?)\s+(?:about|on|regarding)\s+(?P<body>.+)",
        re.I,
    ),
]
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
    if (zh := zh_explicit_request(message)) is not None:
        return zh
    m = _EXPLICIT.search(message)
    return _clean(m.group("body")) if m else None


def correction(message: str) -> str | None:
    if (zh := zh_correction(message)) is not None:
        return zh
    m = _CORRECTION.match(message)
    return _clean(m.group("body")) if m and len(m.group("body").split()) >= 2 else None


def forget_request(message: str) -> str | None:
    """What the user explicitly asked to forget, or None (see ``_FORGET``)."""
    if (zh := zh_forget_request(message)) is not None:
        return zh
    for sentence in re.split(r"(?<=[.!?;])\s+|\n+", message.strip()):
        for pattern in _FORGET:
            m = pattern.match(sentence.strip())
            if m is None:
                continue
            body = re.sub(r"(?i)^(?:my|the|that|this|about)\s+", "", m.group("body"))
            body = body.strip().strip(" .!?")
            if body and body.lower() not in {"it", "that", "this", "everything", "me"}:
                return body
    return None


def self_statements(message: str) -> list[str]:
    """Sentences where the user states something about themselves."""
    sentences = [_LEAD.sub("", s.strip()) for s in re.split(r"(?<=[.!?])\s+|\n+", message)]
    english = [_clean(s) for s in sentences if _SELF.match(s) and len(s.split()) >= 3]
    return english + zh_self_statements(message)


def _grounded(text: str, message: str, min_overlap: float = 0.6) -> bool:
    """Whether most content words of ``text`` occur in the user's ``message``."""
    skip = {"user", "users", "s", "the", "a", "an", "is", "are", "was", "has", "have", "their"}
    words = {w for w in re.findall(r"[^\W_]+", text.lower()) if w not in skip}
    said = set(re.findall(r"[^\W_]+", message.lower()))
    return bool(words) and len(words & said) / len(words) >= min_overlap


def claims_fact(text: str) -> bool:
    return bool(_CLAIM.search(text))


# Acknowledgements: an answer made only of these (and stopwords) says nothing to remember.
_ACK = frozenset(
    """noted done sure got understood thanks thank ll ve saved stored recorded acknowledged
    alright fine great perfect cool certainly absolutely course will do did that it i no
    problem welcome glad happy help sounds good right away memorized memorised remembered
    kept mind copy roger note added updated""".split()
)


def trivial_reply(text: str) -> bool:
    """Whether an answer carries nothing to remember: only acknowledgements and stopwords
    ("Noted.", "OK", "Done.", "Got it, I'll remember that!"). A number or any content word
    makes it substantive ("Your locker code is 4417.")."""
    words = fingerprint(text).split()
    return not [w for w in words if w not in STOPWORDS and w not in _ACK]


@dataclass(slots=True)
class Proposal:
    """One thing the gate wants done."""

    kind: ProposalKind
    text: str
    type: MemoryType = MemoryType.FACT
    source: MemorySource = MemorySource.USER_EXPLICIT
    confidence: float = 1.0
    evidence: list[str] = field(default_factory=list)
    supersede: bool = False
    weight: float | None = None
    note: str = ""  # why, for the write result (the evidence check's verdict)


def redact_turn(turn: Turn) -> Turn:
    """The turn with every text and evidence id redacted."""
    return Turn(
        user_message=redact(turn.user_message)[0],
        assistant_message=redact(turn.assistant_message)[0],
        task_conclusion=None if turn.task_conclusion is None else redact(turn.task_conclusion)[0],
        evidence=[redact(e)[0] for e in turn.evidence],
        observations=turn.observations,  # only checked against, never stored
    )


def _checked(text: str, turn: Turn) -> tuple[bool, list[str], str]:
    """Whether ``text`` is backed by the turn's cited results, the evidence ids to keep (the
    supporting observations when it is, every cited id marked unchecked when not) and why."""
    cited = list(dict.fromkeys([*turn.evidence, *turn.observations]))
    if not turn.observations:
        why = "unverified: no cited result to check against" if cited else ""
        return False, [unchecked(e) for e in cited], why
    verdict = check(text, turn.observations, given=turn.user_message)
    if verdict.backed:
        return True, verdict.ids, verdict.reason
    return False, [unchecked(e) for e in cited], verdict.reason


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
                    if re.search(r"(?i)\b(prefer|like|love|hate)\b|喜欢|偏好|讨厌|更爱", s)
                    else MemoryType.FACT
                )
                out.append(Proposal("observation", s, type=mtype, source=MemorySource.INFERRED))
    if turn.task_conclusion and not trivial_reply(turn.task_conclusion):
        text = turn.task_conclusion.strip()
        if perishable(text):
            out.append(Proposal("perishable", text, source=MemorySource.TASK))
        else:
            backed, evidence, why = _checked(text, turn)
            out.append(
                Proposal(
                    "conclusion",
                    text,
                    type=MemoryType.DECISION,
                    source=MemorySource.TASK,
                    confidence=0.8 if backed else 0.4,
                    evidence=evidence,
                    weight=None if backed or not claims_fact(text) else unsupported_weight,
                    note=why,
                )
            )
    for d in distilled or []:
        if d.source == MemorySource.USER_EXPLICIT and not _grounded(d.text, msg):
            # The model may only call it explicit when the user said it; otherwise inferred.
            source = MemorySource.INFERRED
        else:
            source = d.source
        if source != MemorySource.USER_EXPLICIT and perishable(d.text):
            continue
        backed, evidence, _why = _checked(d.text, turn)
        has_evidence = backed or source == MemorySource.USER_EXPLICIT
        out.append(
            Proposal(
                "distilled",
                d.text,
                type=d.type,
                source=source,
                confidence=d.confidence,
                evidence=evidence,
                weight=None if has_evidence or not claims_fact(d.text) else unsupported_weight,
            )
        )
    return out
