"""Text utilities shared by memory and the agent: language detection, a tokenizer-free token
estimate, and whether a text states a value (numbers by value and scale, dates as dates).

A leaf: it imports nothing from ``agent``, ``memory``, ``serving`` or ``bench``, so each of them
can use it without reaching into another's internals.

``estimate_tokens`` counts what a Qwen-style BPE tokenizer makes of a text without loading
it: ``CJK_TOKENS_PER_CHAR`` (0.65) per CJK character (Qwen2.5's tokenizer gives 0.55-0.66
tokens per character of Chinese prose, where the old ``chars / 4`` counted 0.25), one token
per digit, 1.1 per Latin word and 0.8 per other symbol. Fitted on, and checked against, the
served tokenizer by ``tests/unit/memory/test_memory_language.py``: each sample within 25 %,
each language's total within 15 %.

``numbers`` reads numbers with their scale ("120k", "1.2 million", "12万", "3亿") and
percentages; ``dates`` reads "2026-03-03", "March 3", "3 March", "3月3日", "2026年3月3日" as
(month, day); ``mentions`` uses both to decide whether a text states a value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CJK_TOKENS_PER_CHAR",
    "MONTHS",
    "Number",
    "blank",
    "char_pairs",
    "cjk_chars",
    "dates",
    "estimate_tokens",
    "has_cjk",
    "mentions",
    "mostly_chinese",
    "numbers",
    "text_units",
]

# --- languages and token estimates ----------------------------------------------------------

#: Tokens per CJK character (Qwen2.5 tokenizer on Chinese prose; see the module docstring).
CJK_TOKENS_PER_CHAR = 0.65

# CJK ideographs (incl. extension A and compatibility), kana, hangul, CJK punctuation and
# full-width forms: every one of these is about one token or more in a BPE vocabulary.
_CJK = re.compile(
    r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
_IDEOGRAPHS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # for a character class
_IDEOGRAPH = re.compile(rf"[{_IDEOGRAPHS}]")
_CJK_RUN = re.compile(rf"[{_IDEOGRAPHS}]+")
_NON_CJK_WORD = re.compile(rf"[^\W{_IDEOGRAPHS}]+")
_DIGIT = re.compile(r"[0-9]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_OTHER = re.compile(r"[^\sA-Za-z0-9]")


def has_cjk(text: str) -> bool:
    return _IDEOGRAPH.search(text) is not None


def cjk_chars(text: str) -> int:
    return len(_CJK.findall(text))


def mostly_chinese(text: str) -> bool:
    """Written in Chinese: at least two ideographs, and no fewer than its Latin words (an
    order id or a brand name inside a Chinese sentence does not make it English)."""
    ideographs = len(_IDEOGRAPH.findall(text))
    return ideographs >= 2 and ideographs >= len(_LATIN_WORD.findall(text))


def estimate_tokens(text: str) -> int:
    """Tokenizer-free estimate for a Qwen-style BPE vocabulary (see the module docstring):
    ``0.65`` per CJK character, one per digit (Qwen splits numbers digit by digit), ``1.1``
    per Latin word (a quarter per letter beyond 12 letters), ``0.8`` per other symbol; never
    fewer than one per whitespace word."""
    if not text:
        return 0
    cjk = cjk_chars(text)
    digits = len(_DIGIT.findall(text))
    # a word is ~1 token; a long run (an id, a hash, base64) about one per 4 letters
    words = sum(1.1 if len(w) <= 12 else len(w) / 4 for w in _LATIN_WORD.findall(text))
    other = len(_OTHER.findall(text)) - cjk
    est = CJK_TOKENS_PER_CHAR * cjk + digits + words + 0.8 * max(0, other)
    return max(math.ceil(est), len(text.split()))


def char_pairs(text: str) -> set[str]:
    """The character pairs of ``text``'s Chinese runs (a one-character run is its own unit):
    Chinese has no spaces, so pairs stand in for its words when texts are compared."""
    return {r[i : i + 2] for r in _CJK_RUN.findall(text) for i in range(max(1, len(r) - 1))}


def text_units(text: str) -> set[str]:
    """What two texts in either language are compared by: the lower-cased words of the
    text that is not Chinese, and `char_pairs` of the Chinese."""
    lowered = text.lower()
    return set(_NON_CJK_WORD.findall(lowered)) | char_pairs(lowered)


# --- values: numbers and dates --------------------------------------------------------------

#: Month names and abbreviations (lower case) -> month number.
MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            "jan january",
            "feb february",
            "mar march",
            "apr april",
            "may",
            "jun june",
            "jul july",
            "aug august",
            "sep sept september",
            "oct october",
            "nov november",
            "dec december",
        ]
    )
    for m in names.split()
}
_MONTH = r"(?:" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DATES = [
    (re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"), "ymd"),
    (re.compile(r"(?:(\d{4})\s*年\s*)?(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]"), "ymd"),
    (re.compile(rf"(?i)\b({_MONTH})\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}}))?"), "mdy"),
    (
        re.compile(
            rf"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH})\b(?:,?\s+(\d{{4}}))?"
        ),
        "dmy",
    ),
]
_SCALE = {
    "k": 1e3,
    "thousand": 1e3,
    "千": 1e3,
    "万": 1e4,
    "m": 1e6,
    "million": 1e6,
    "mn": 1e6,
    "百万": 1e6,
    "b": 1e9,
    "bn": 1e9,
    "billion": 1e9,
    "亿": 1e8,
}
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?P<num>-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?)"
    r"(?:\s?(?P<scale>百万|万|亿|千|(?:thousand|million|billion|mn|bn|k|m|b)(?![A-Za-z])))?"
    r"(?P<pct>\s?%|\s?percent\b|\s?个百分点)?"
)


@dataclass(frozen=True, slots=True)
class Number:
    """A number as written: ``value`` x ``scale`` is what it says."""

    value: float  # mantissa as written
    decimals: int
    scale: float
    percent: bool
    text: str


def dates(text: str) -> Iterator[tuple[tuple[int, int], int, int]]:
    """((month, day), start, end) of every date in ``text``."""
    for pattern, order in _DATES:
        for m in pattern.finditer(text):
            if order == "ymd":
                month, day = int(m.group(2)), int(m.group(3))
            elif order == "mdy":
                month, day = MONTHS[m.group(1).lower().rstrip(".")], int(m.group(2))
            else:
                month, day = MONTHS[m.group(2).lower().rstrip(".")], int(m.group(1))
            if 1 <= month <= 12 and 1 <= day <= 31:
                yield (month, day), m.start(), m.end()


def blank(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each (start, end) span replaced by as many spaces."""
    for a, b in sorted(spans, reverse=True):
        text = text[:a] + " " * (b - a) + text[b:]
    return text


def numbers(text: str) -> list[Number]:
    """Every number of ``text`` with its scale and whether it is a percentage."""
    out = []
    for m in _NUMBER.finditer(text):
        raw = m.group("num").replace(",", "")
        scale = _SCALE.get((m.group("scale") or "").lower(), 1.0)
        decimals = len(raw.split(".")[1]) if "." in raw else 0
        out.append(Number(float(raw), decimals, scale, bool(m.group("pct")), m.group(0).strip()))
    return out


def mentions(text: str, value: str) -> bool:
    """Whether ``text`` states ``value`` (a result's leaf value): a number by value and scale
    ("120000" in "12万" or "120k"), a date as a date ("2026-03-03" in "3月3日"), anything
    else as a case-blind substring (Chinese text has no word boundaries)."""
    if re.fullmatch(r"-?\d+(?:\.\d+)?", value.strip()):
        number = float(value)
        found = numbers(blank(text, [(a, b) for _, a, b in dates(text)]))
        return any(n.value * n.scale == number for n in found)
    wanted = {d for d, _, _ in dates(value)}
    if wanted and wanted & {d for d, _, _ in dates(text)}:
        return True
    return value.lower() in text.lower()
