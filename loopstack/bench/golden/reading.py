"""Reading an answer as a careful human grader would.

* Numbers are read as whole numbers: word-bounded (``143`` is not read inside ``1434`` and
  ``17:00`` holds no ``7``), thousands separators allowed (``1,200``), small counts written as
  words (``three``). Signs come from a minus or from the words around a change ("fell by 0.7").
* Names are matched as words, case-insensitive.
* Dates are read in the common formats (``2025-11-14``, ``14 Nov 2025``, ``November 14, 2025``,
  ``14/11/2025``, ``Nov 14``); clock times as ``7:00``, ``07:00:00``, ``7 AM``, ``7:00 p.m.``.
* Yes/no is read from the first polar cue, so "No, there is no chance of rain" is a no.

Every function here is pure: the checkers in `loopstack.bench.golden.checks` build on them.
"""

from __future__ import annotations

import re
from datetime import date

__all__ = [
    "clock_times",
    "dates",
    "names",
    "numbers",
    "polarity",
    "signed_changes",
    "whole_word",
]

_SIGNS = "-\u2212\u2013"  # hyphen-minus, minus sign, en dash
_MINUS = re.escape(_SIGNS)  # for a character class
# "glued to a word" means a Latin letter, digit or underscore: Python's \w (and \b) count
# Chinese characters as word characters, and "需要13天" or "预计在2026-12-09送达" must read
_ASCII_WORD = "A-Za-z0-9_"
_NUMBER = re.compile(
    rf"(?<![{_ASCII_WORD}.,:/{_MINUS}])([{_MINUS}]?)"  # a sign, unless glued to a word or number
    r"(\d{1,3}(?:,\d{3})+|\d{1,3}(?:[\u202f\u00a0]\d{3})+|\d+)"  # 1,200 / 1 200 / 1200
    r"(\.\d+)?"
    rf"(?![{_ASCII_WORD}]|[.,:/]\d)"  # not the start of a longer token (12:00, 3.5.1, 2025/11)
)
_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_WORD_NUMBER = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)


def numbers(text: str) -> list[float]:
    """Every number written in ``text``, in order (digits first, then number words)."""
    found = []
    for sign, whole, frac in _NUMBER.findall(text):
        digits = re.sub(r"[,\u202f\u00a0]", "", whole) + (frac or "")
        value = float(digits)
        found.append(-value if sign else value)
    found += [float(_WORDS[w.lower()]) for w in _WORD_NUMBER.findall(text)]
    return found


_DOWN = r"(?:fell|fall(?:en|s)?|decreas(?:ed|e|es|ing)|dropp?(?:ed|s)?|declin(?:ed|e|es|ing)|"
_DOWN += r"down|shr[au]nk|lower|lost|los(?:s|ing)|negative)"
_UP = r"(?:rose|ris(?:en|e|es|ing)|increas(?:ed|e|es|ing)|gr[eo]wn?|growth|up|higher|gain(?:ed)?|"
_UP += r"positive)"
_CHANGE = re.compile(
    rf"\b(?P<dir>{_DOWN}|{_UP})\b(?:\s+(?:of|by|to|about|around|approximately|roughly|"
    rf"some|a|an|total|overall|year-over-year|yoy))*\s+(?P<num>[{_MINUS}+]?\d[\d,]*(?:\.\d+)?)",
    re.IGNORECASE,
)


def signed_changes(text: str) -> list[float]:
    """Changes with their sign: explicit signs (``-0.7%``) and directions in words
    ("fell by 0.7 percent" is -0.7, "grew 3.7%" is +3.7). A number that carries no sign and
    no direction is not a change."""
    out: list[float] = []
    taken: list[tuple[int, int]] = []
    for m in _CHANGE.finditer(text):
        raw = m.group("num").replace(",", "")
        value = abs(float(raw.lstrip(_SIGNS + "+")))
        down = re.fullmatch(_DOWN, m.group("dir"), re.IGNORECASE) is not None
        if raw[0] in _SIGNS:  # "decreased by -0.7%": the sign is already written
            down = True
        out.append(-value if down else value)
        taken.append(m.span("num"))
    for m in re.finditer(rf"(?<![{_ASCII_WORD}.])([{_MINUS}+])(\d+(?:\.\d+)?)\s*(%|percent)", text):
        if any(a <= m.start(2) < b for a, b in taken):
            continue
        value = float(m.group(2))
        out.append(value if m.group(1) == "+" else -value)
    return out


def whole_word(word: str) -> re.Pattern[str]:
    """``word`` as a whole word, case-insensitive: no Latin letter, digit, ``_`` or ``-``
    touches it; Chinese may ("最差的是South区" names South)."""
    edge = f"{_ASCII_WORD}-"
    return re.compile(rf"(?<![{edge}]){re.escape(word)}(?![{edge}])", re.IGNORECASE)


_CJK = re.compile(r"[\u3400-\u9fff]")


def mentions(text: str, word: str) -> list[int]:
    """Where ``word`` occurs: a whole word for Latin text, anywhere for Chinese."""
    if _CJK.search(word):
        return [m.start() for m in re.finditer(re.escape(word), text)]
    return [m.start() for m in whole_word(word).finditer(text)]  # "订单B-1002已送达"


def names(text: str, candidates: list[str] | tuple[str, ...]) -> list[str]:
    """Which of ``candidates`` the text names, as whole words (case-insensitive), in the
    order they first appear."""
    hits = []
    for c in candidates:
        if m := whole_word(c).search(text):
            hits.append((m.start(), c))
    return [c for _, c in sorted(hits)]


_MONTHS = {
    m: i
    for i, names_ in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for m in names_
}
_MONTH = r"(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_NOT_GLUED, _NOT_BEFORE = rf"(?<![{_ASCII_WORD}])", rf"(?![{_ASCII_WORD}])"  # Chinese may touch
_DATE_FORMS = [
    (re.compile(rf"{_NOT_GLUED}(\d{{4}})-(\d{{1,2}})-(\d{{1,2}}){_NOT_BEFORE}"), ("y", "m", "d")),
    (re.compile(rf"{_NOT_GLUED}(\d{{4}})/(\d{{1,2}})/(\d{{1,2}}){_NOT_BEFORE}"), ("y", "m", "d")),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH},?(?:\s+(\d{{4}}))?\b", re.I),
     ("d", "M", "y")),
    (re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}}))?", re.I),
     ("M", "d", "y")),
    (re.compile(rf"{_NOT_GLUED}(\d{{1,2}})[./](\d{{1,2}})[./](\d{{4}}){_NOT_BEFORE}"),
     ("a", "b", "y")),
]  # fmt: skip


def dates(text: str) -> list[tuple[int | None, int, int]]:
    """Every (year or None, month, day) written in ``text``. ``14/11/2025`` reads as day first
    and ``11/14/2025`` as month first; a numeric date that could be either gives both."""
    out: list[tuple[int | None, int, int]] = []
    for pattern, order in _DATE_FORMS:
        for m in pattern.finditer(text):
            parts = dict(zip(order, m.groups(), strict=True))
            year = int(parts["y"]) if parts.get("y") else None
            if "M" in parts:
                readings = [(_MONTHS[parts["M"].lower()], int(parts["d"]))]
            elif "a" in parts:
                a, b = int(parts["a"]), int(parts["b"])
                readings = [(b, a), (a, b)]  # day first, then month first
            else:
                readings = [(int(parts["m"]), int(parts["d"]))]
            for month, day in readings:
                try:
                    date(year or 2000, month, day)
                except ValueError:
                    continue
                out.append((year, month, day))
    return out


_CLOCK = re.compile(
    r"(?<![\d:.+\-])(\d{1,2}):(\d{2})(?::\d{2}(?:\.\d+)?)?(?![\d:])"  # not +09:00
    r"(?:\s*([ap])\.?\s?m\b\.?)?",
    re.IGNORECASE,
)
_HOUR_ONLY = re.compile(r"(?<![\d:.])(\d{1,2})\s*([ap])\.?\s?m\b\.?", re.IGNORECASE)


def clock_times(text: str, *, twelve_hour_guess: bool = False) -> set[tuple[int, int]]:
    """Every clock time (hour 0-23, minute) in ``text``. A time with AM/PM is converted; a
    time without it reads as written (``7:00`` is 07:00, ``17:00`` is 17:00), and with
    ``twelve_hour_guess`` an hour of 1-12 also reads as the afternoon."""
    out: set[tuple[int, int]] = set()
    found = [(h, mi, ap) for h, mi, ap in _CLOCK.findall(text)]
    found += [(h, "00", ap) for h, ap in _HOUR_ONLY.findall(text)]
    for h_raw, m_raw, ap in found:
        h, mi = int(h_raw), int(m_raw)
        if h > 23 or mi > 59:
            continue
        if ap:
            if not 1 <= h <= 12:
                continue
            h = h % 12 + (12 if ap.lower() == "p" else 0)
            out.add((h, mi))
            continue
        out.add((h, mi))
        if twelve_hour_guess and 1 <= h <= 12:
            out.add(((h % 12) + 12, mi))
            out.add((h % 12, mi))
    return out


_NEGATIVE = (
    r"no|not|never|none|nope|don't|dont|do not|doesn't|does not|won't|will not|isn't|is not|"
    r"aren't|are not|without|unnecessary|needn't|need not"
)
_AFFIRMATIVE = (
    r"yes|yeah|yep|definitely|certainly|absolutely|recommended|advisable|a good idea|"
    r"you(?:'ll| should| will| do| need| want| must)(?!n't| not)|bring|take|pack|carry"
)
_POLAR = re.compile(rf"\b({_NEGATIVE}|{_AFFIRMATIVE})\b", re.IGNORECASE)


def polarity(text: str) -> bool | None:
    """True for a yes, False for a no, None when the text takes no side. Read from the first
    polar cue, so "No, there is no chance of rain" and "You do not need one" are both no."""
    m = _POLAR.search(text.replace("\u2019", "'"))
    if m is None:
        return None
    return re.fullmatch(_NEGATIVE, m.group(1), re.IGNORECASE) is None
