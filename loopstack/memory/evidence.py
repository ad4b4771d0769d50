"""Checked evidence: does a conclusion say only what the results it cites contain?

An agent's task conclusion arrives with the results it may rest on (``Turn.observations``:
evidence id -> the tool result's text). ``check`` splits the conclusion into claims (a
sentence; in Chinese also a clause; a causal tail such as "because ..." / "因为..." is a claim
of its own) and pulls out what each one asserts that can be checked:

* numbers, with their scale ("120k", "1.2 million", "12万", "3亿") and percentages (a
  percentage also matches the ratio or change of two numbers in the results);
* dates ("2026-03-03", "March 3", "3 March", "3月3日", "2026年3月3日"), compared as dates;
* quoted names ("...", “...”, 「...」, 《...》) and capitalised entity spans ("Acme Corp");
* Chinese entity spans: a string value of a result that the claim repeats.

A value the user's own message already holds proves nothing and is not checked. A claim is
*supported* when it asserts at least one checkable value and every one of them appears in the
cited results; it is *unsupported* when one of its values appears nowhere, or when it states a
fact (a verb such as "is" / "是", a cause such as "due to" / "因为") without any checkable
value - "the drop is mainly due to losing a big customer" rests on nothing a tool returned.
A conclusion is evidence-backed only when some claim is supported and none is unsupported; its
evidence ids are then the observations that supplied a supported value, nothing else.

``perishable`` names what goes stale within a day (weather, prices, "today", "now", "目前",
"今天"): the promotion gate keeps such conclusions out of long-term memory.

Pure functions, no I/O; ``loopstack.memory.writeback`` calls them for every conclusion.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopstack.text import MONTHS, Number, blank, dates, has_cjk, numbers

__all__ = ["Support", "check", "claims", "perishable"]

_QUOTED = re.compile(
    r'"([^"\n]{2,60})"|“([^”\n]{1,60})”|「([^」\n]{1,60})」|『([^』\n]{1,60})』|《([^》\n]{1,60})》'
)
_ENTITY = re.compile(r"\b[A-Z][\w&'.-]*(?:\s+(?:of\s+|&\s+)?[A-Z][\w&'.-]*)*")
_ENTITY_SKIP = frozenset(
    """the a an this that these those our we i it its in on at for of and or but so my your
    their they he she there here if when after before because due as by from to with""".split()
)
_CAUSE = re.compile(
    r"(?i)\s*(?=\b(?:because|due to|caused by|driven by|owing to|as a result of|thanks to|"
    r"the reason (?:is|was)|mainly since)\b)"
    r"|(?=是因为)|(?<!是)(?=因为|由于|导致|归因于|原因是|原因在于)"
)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])\s*|\n+")
_ZH_CLAUSE = re.compile(r"(?<=[，,：:])\s*")
_CLAIM_EN = re.compile(
    r"(?i)\b(?:is|are|was|were|has|have|had|will|costs?|equals?|located|founded|born|"
    r"because|due|caused|driven|lost|losing|grew|fell|dropped|rose|increased|decreased)\b"
)
_CLAIM_ZH = re.compile(
    r"是|为|有|因为|由于|导致|造成|原因|属于|位于|成立|下降|上升|增长|减少|失去|丢失|流失|等于"
)
_PERISHABLE = re.compile(
    r"(?i)\b(?:weather|forecast|temperatures?|raining|sunny|(?:stock|share|spot|current|"
    r"today'?s|latest) prices?|exchange rates?|stock quotes?|today|tonight|right now|currently|"
    r"at the moment|at present|as of now|this (?:morning|afternoon|evening)|live score)\b"
    r"|天气|气温|温度|预报|下雨|股价|报价|价格|汇率|今天|今日|今晚|今早|现在|目前|当前|此刻|实时|眼下"
)


def perishable(text: str) -> bool:
    """Whether ``text`` is about something that goes stale within a day (see the module)."""
    return _PERISHABLE.search(text) is not None


# --- values ------------------------------------------------------------------------------------


def _entities(text: str) -> list[str]:
    out = []
    for m in _ENTITY.finditer(text):
        words = m.group(0).rstrip(".'").split()
        while words and words[0].lower() in _ENTITY_SKIP:
            words = words[1:]
        if not words:
            continue
        at_start = not text[: m.start()].strip() or text[: m.start()].rstrip()[-1] in '.!?:;"('
        if len(words) == 1 and words[0].isalpha() and (at_start or len(words[0]) < 2):
            continue  # a capitalised first word is just grammar
        if len(words) == 1 and words[0].isalpha() and words[0].lower() in MONTHS:
            continue
        out.append(" ".join(words))
    return out


def _quoted(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)]


@dataclass(slots=True)
class _Source:
    """One cited result, flattened for matching."""

    id: str
    text: str
    lower: str
    numbers: list[float]
    dates: set[tuple[int, int]]
    strings: list[str]  # its string leaves with CJK (candidate entity spans)


def _leaves(value: Any, keys: bool = False) -> Iterator[Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            if keys:
                yield str(k)
            yield from _leaves(v, keys)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v, keys)
    elif value is not None and not isinstance(value, bool):
        yield value


def _source(ref: str, raw: str) -> _Source:
    try:
        body = json.loads(raw)
        leaves = list(_leaves(body))
        named = "\n".join(str(v) for v in _leaves(body, keys=True))  # "q2_sales" names Q2
    except (json.JSONDecodeError, TypeError, ValueError):
        leaves, named = [raw], raw
    text = "\n".join(str(v) for v in leaves)
    nums = [n.value * n.scale for n in numbers(blank(text, [(a, b) for _, a, b in dates(text)]))]
    nums += [float(v) for v in leaves if isinstance(v, int | float)]
    strings = [
        s
        for v in leaves
        if isinstance(v, str)
        for s in re.split(r"[\s,，、。；;：:()（）]+", v)
        if 2 <= len(s) <= 30 and has_cjk(s)
    ]
    return _Source(ref, text, named.lower(), nums[:200], {d for d, _, _ in dates(text)}, strings)


def _num_in(n: Number, pool: list[float]) -> bool:
    def close(x: float) -> bool:
        return round(x / n.scale, n.decimals) == round(n.value, n.decimals)

    if any(close(x) or close(-x) for x in pool):
        return True
    if n.percent:  # a share or a change computed from two results
        vals = [x for x in pool if x][:60]
        for a in vals:
            for b in vals:
                if a is not b and (close(100 * a / b) or close(abs(100 * (a - b) / b))):
                    return True
    return False


# --- claims ------------------------------------------------------------------------------------


def claims(text: str) -> list[str]:
    """The conclusion split into claims (sentences; Chinese clauses; causal tails apart)."""
    out: list[str] = []
    for sentence in _SENTENCE.split(text.strip()):
        parts = _ZH_CLAUSE.split(sentence) if has_cjk(sentence) else [sentence]
        for part in parts:
            for piece in _CAUSE.split(part):
                piece = piece.strip(" ,，.。;；:：!！")
                if piece:
                    out.append(piece)
    return out


@dataclass(slots=True)
class Support:
    """The verdict of ``check``."""

    backed: bool
    ids: list[str] = field(default_factory=list)  # observations that support a claim
    supported: list[str] = field(default_factory=list)  # values found in the results
    missing: list[str] = field(default_factory=list)  # values (or bare claims) found nowhere

    @property
    def reason(self) -> str:
        if self.backed:
            return "checked: " + ", ".join(self.supported[:6]) + " found in the cited results"
        if self.missing:
            return "unverified: not in the cited results: " + "; ".join(self.missing[:4])
        return "unverified: asserts nothing the cited results contain"


def _claim_values(claim: str, given: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """(checkable values, quoted/entity strings) of one claim, minus those ``given``."""
    spans = []
    values: list[tuple[str, Any]] = []
    given_dates = {d for d, _, _ in dates(given)}
    for d, a, b in dates(claim):
        spans.append((a, b))
        if d not in given_dates:
            values.append((claim[a:b], d))
    rest = blank(claim, spans)
    given_nums = [n.value * n.scale for n in numbers(given)]
    for n in numbers(rest):
        if not _num_in(Number(n.value, n.decimals, n.scale, False, n.text), given_nums):
            values.append((n.text, n))
    low_given = given.lower()
    names = [s for s in _quoted(rest) + _entities(rest) if s.lower() not in low_given]
    return values, names


def check(conclusion: str, observations: Mapping[str, str], *, given: str = "") -> Support:
    """Whether ``conclusion`` is backed by ``observations`` (see the module docstring)."""
    sources = [_source(ref, raw) for ref, raw in observations.items()]
    ids: dict[str, None] = {}
    supported: list[str] = []
    missing: list[str] = []
    any_supported = False
    for claim in claims(conclusion):
        values, names = _claim_values(claim, given)
        hits: list[str] = []
        misses: list[str] = []
        for label, value in values:
            if isinstance(value, tuple):
                where = [s for s in sources if value in s.dates]
            else:
                where = [s for s in sources if _num_in(value, s.numbers)]
            (hits if where else misses).append(label)
            ids.update((s.id, None) for s in where)
        low_given = given.lower()
        for name in names:
            # a multi-word span ("EMEA Q3") counts word by word; words the user gave drop out
            words = [w for w in name.lower().split() if w not in low_given]
            if not words:
                continue
            where = [
                s for s in sources if name.lower() in s.lower or all(w in s.lower for w in words)
            ]
            (hits if where else misses).append(name)
            ids.update((s.id, None) for s in where)
        if has_cjk(claim):  # Chinese entity spans a result holds and the claim repeats
            for s in sources:
                spans = [x for x in s.strings if x in claim and x not in given]
                if spans:
                    hits += spans[:3]
                    ids[s.id] = None
        if misses:
            missing += misses
        elif hits:
            any_supported = True
            supported += hits
        elif _CLAIM_ZH.search(claim) if has_cjk(claim) else _CLAIM_EN.search(claim):
            missing.append(claim)
    backed = any_supported and not missing
    keep = [s.id for s in sources if s.id in ids] if backed else []
    return Support(backed, keep, list(dict.fromkeys(supported)), missing)
