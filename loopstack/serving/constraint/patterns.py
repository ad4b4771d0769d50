"""Regex pieces for JSON values, in the dialect both Python's `re` and vLLM's engine read.

* `json_safe_pattern` - a JSON Schema ``pattern`` made to match only what a JSON string
  can hold unescaped (and ECMA-262's ASCII ``\\d``/``\\w``);
* `int_range_regex` / `number_range_regex` - exactly the numbers inside ``minimum``/
  ``maximum`` (outlines_core ignores numeric bounds);
* `json_value_regex` - any JSON value, object or array, to a nesting depth;
* `regex_literal` - text as a regex; `require_regex_text` - a client's regex within bounds.
"""

from __future__ import annotations

import json
import re

from loopstack.serving.exceptions import InvalidRequest

# A sanity bound on the regex text itself (vLLM parses it with Python's `re` first). What a
# regex costs to compile is its automaton, measured by
# `loopstack.serving.constraint.regexes.AutomatonProbe`.
MAX_REGEX_CHARS = 200_000
STRING_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'
# JSON Schema patterns are ECMA-262: \d and \w are ASCII. vLLM's (Rust) engine reads them as
# Unicode, whose automaton is far larger (a 650-character regex with four \w{8} took 2.7 s).
_WORD = "0-9A-Za-z_"
_SHORTHAND_RANGES = {"d": [(48, 57)], "w": [(48, 57), (65, 90), (95, 95), (97, 122)]}
_NEGATED_SHORTHAND = {"S": r"\s", "W": _WORD, "D": "0-9"}


def json_safe_pattern(pattern: str) -> tuple[str, bool]:
    """Make a `pattern` match only characters a JSON string can hold unescaped.

    Outlines puts the pattern between quotes as is, so ``.``, ``[^a]`` or ``[ -~]`` would
    admit ``"``, ``\\`` and control characters: output that is not JSON, and an automaton
    that explodes (``arn:.*:.*:.+`` took 13 s to compile, 1.3 s once made JSON-safe;
    ``[\\S\\s]+`` made vLLM run out of memory; ``[\\u0020-\\u00FF]+`` inside an array never
    finished). ``.``, ``\\S``/``\\W``/``\\D`` and every class lose the unsafe characters;
    ``\\s`` becomes a plain space; octal escapes (``\\000``, which vLLM's regex engine rejects)
    become hex. A positive class holding ``\\S``/``\\W``/``\\D``/``\\P{..}`` becomes "any safe
    character", a superset: the result is then marked inexact (second value False) so the
    output is validated. Anchors go: between the quotes the pattern must match the whole
    string anyway, and a ``^`` Outlines keeps is unsatisfiable.
    """
    if _UNSUPPORTED.search(pattern):  # vLLM's engine has no lookaround or backreference
        return f"({STRING_CHAR}*)", False
    out: list[str] = []
    exact = True
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt in _NEGATED_SHORTHAND:
                out.append(f"[^{_NEGATED_SHORTHAND[nxt]}{_UNSAFE}]")
                i += 2
            elif nxt == "s":
                out.append(" ")
                i += 2
            else:
                token, i = _escape_token(pattern, i)
                if isinstance(token, int):
                    out.append(_literal_regex(token))
                elif token[1] in _SHORTHAND_RANGES:
                    out.append("[" + _WORD[: 3 if token[1] == "d" else None] + "]")
                elif token[1] in "pP":  # Unicode properties: Python's `re` (and vLLM) lack them
                    out.append(STRING_CHAR)
                    exact = False
                elif token[1] in "bB":  # word boundaries: unsupported, checked afterwards
                    exact = False
                else:
                    out.append(token)
        elif c == "[":
            cls, i, cls_exact = _safe_class(pattern, i)
            out.append(cls)
            exact &= cls_exact
        elif c == ".":
            out.append(STRING_CHAR)
            i += 1
        elif c in "^$":
            i += 1  # anchors: the pattern already spans the whole string between the quotes
        else:
            out.append(_literal_regex(ord(c)) if _is_unsafe(ord(c)) else c)
            i += 1
    return "(" + "".join(out) + ")", exact  # Outlines adds the quotes: keep `a|b` inside


_UNSUPPORTED = re.compile(r"\(\?<?[=!]|(?<!\\)\\[1-9]")
_UNSAFE = '"\\\\\\x00-\\x1F\\x7F-\\x9F'
_UNSAFE_RANGES = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x9F))
_SIMPLE_ESCAPES = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11, "a": 7, "e": 27}


def _escape_token(pattern: str, i: int) -> tuple[int | str, int]:
    """Read the escape at pattern[i] (a backslash): a code point, or a class token kept as
    text (``\\d``, ``\\w``, ``\\p{L}``, ...). Returns it and the index after it."""
    nxt = pattern[i + 1]
    if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", pattern[i + 2 : i + 6]):
        return int(pattern[i + 2 : i + 6], 16), i + 6
    if nxt == "x" and pattern.startswith("{", i + 2) and "}" in pattern[i + 3 :]:
        end = pattern.index("}", i + 3)
        try:
            return int(pattern[i + 3 : end], 16), end + 1
        except ValueError:
            return pattern[i : i + 2], i + 2
    if nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[i + 2 : i + 4]):
        return int(pattern[i + 2 : i + 4], 16), i + 4
    if nxt == "0":
        digits = re.match(r"[0-7]{0,2}", pattern[i + 2 :])
        octal = digits.group(0) if digits else ""
        return int("0" + octal, 8), i + 2 + len(octal)
    if nxt in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[nxt], i + 2
    if nxt in "pP" and pattern.startswith("{", i + 2) and "}" in pattern[i + 3 :]:
        end = pattern.index("}", i + 3)
        return pattern[i : end + 1], end + 1
    if nxt in "dwbBSWD" or nxt.isdigit():
        return pattern[i : i + 2], i + 2
    return ord(nxt), i + 2  # an escaped literal: \. \- \] \\ \/ ...


def _safe_class(pattern: str, i: int) -> tuple[str, int, bool]:
    """The class starting at pattern[i] (``[``) without unsafe characters, the index after
    it, and whether it is exact."""
    j = i + 1
    negated = pattern.startswith("^", j)
    j += negated
    ranges: list[tuple[int, int]] = []
    tokens: list[str] = []
    first = True
    while j < len(pattern) and (pattern[j] != "]" or first):
        first = False
        if pattern[j] == "\\" and j + 1 < len(pattern):
            if pattern[j + 1] == "s":
                lo: int | str = 32 if not negated else "\\s"
                j += 2
            else:
                lo, j = _escape_token(pattern, j)
        else:
            lo, j = ord(pattern[j]), j + 1
        if isinstance(lo, str):
            if lo[1] in _SHORTHAND_RANGES:
                ranges += _SHORTHAND_RANGES[lo[1]]
            else:
                tokens.append(lo)
            continue
        if pattern.startswith("-", j) and j + 1 < len(pattern) and pattern[j + 1] != "]":
            if pattern[j + 1] == "\\":
                hi, j = _escape_token(pattern, j + 1)
            else:
                hi, j = ord(pattern[j + 1]), j + 2
            if isinstance(hi, str):  # [a-\d]: a literal '-' and a class
                ranges += [(lo, lo), (45, 45), *_SHORTHAND_RANGES.get(hi[1], [])]
                tokens += [] if hi[1] in _SHORTHAND_RANGES else [hi]
                continue
            ranges.append((lo, hi))
        else:
            ranges.append((lo, lo))
    end = j + 1
    if any(t[1] in "pP" for t in tokens):
        return STRING_CHAR, end, False
    if negated:
        body = "".join(_range_regex(a, b) for a, b in ranges) + "".join(tokens)
        return f"[^{_UNSAFE}{body}]", end, True
    safe = [piece for a, b in ranges for piece in _subtract_unsafe(a, b)]
    if any(t[1] in "SWD" for t in tokens) or not (safe or tokens):
        return STRING_CHAR, end, False  # a superset (or, for ["], any character): validated
    body = "".join(_range_regex(a, b) for a, b in safe) + "".join(tokens)
    return f"[{body}]", end, True


def _is_unsafe(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _UNSAFE_RANGES)


def _literal_regex(cp: int) -> str:
    """A character outside a class. One a JSON string cannot hold as is (``"``, ``\\``,
    controls) is matched in its escaped form (``\\"``): the decoded string is the same."""
    if not _is_unsafe(cp):
        return _char_regex(cp)
    escaped = json.dumps(chr(cp))[1:-1]  # \" \\ \n \u007f ...
    return "".join(ch if ch.isalnum() or ch == '"' else "\\" + ch for ch in escaped)


def _subtract_unsafe(lo: int, hi: int) -> list[tuple[int, int]]:
    pieces = [(lo, hi)]
    for u_lo, u_hi in _UNSAFE_RANGES:
        nxt = []
        for a, b in pieces:
            if b < u_lo or a > u_hi:
                nxt.append((a, b))
                continue
            if a < u_lo:
                nxt.append((a, u_lo - 1))
            if b > u_hi:
                nxt.append((u_hi + 1, b))
        pieces = nxt
    return pieces


def _char_regex(cp: int, *, in_class: bool = False) -> str:
    """One character as regex text both Python's `re` and vLLM's (Rust) engine read alike."""
    ch = chr(cp)
    if cp < 0x20 or cp >= 0x7F:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"
    special = "\\]^-[&~" if in_class else "\\.^$|?*+()[]{}/"
    return "\\" + ch if ch in special else ch


def _range_regex(lo: int, hi: int) -> str:
    a, b = _char_regex(lo, in_class=True), _char_regex(hi, in_class=True)
    return a if lo == hi else f"{a}-{b}"


_JSON_STRING = r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'
_JSON_NUMBER = r"(-)?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-][0-9]+)?"


def json_value_regex(depth: int, kind: str = "any") -> str:
    """Any JSON value (`kind` "object"/"array": only that) nesting at most `depth` containers.

    Outlines writes a free-form ``{"type": "object"}`` as 9,900 characters of regex (13,000
    for ``{}``), repeating the scalar alternatives at every level; this is a third of that
    for the same nesting, so a map of free-form objects no longer trips `MAX_REGEX_CHARS`.
    """
    if depth == 0:
        return rf"({_JSON_STRING}|{_JSON_NUMBER}|true|false|null)"
    inner = json_value_regex(depth - 1)
    obj = rf"\{{({_JSON_STRING}:{inner}(,{_JSON_STRING}:{inner})*)?\}}"
    arr = rf"\[({inner}(,{inner})*)?\]"
    if kind == "object":
        return obj
    if kind == "array":
        return arr
    return rf"({_JSON_STRING}|{_JSON_NUMBER}|true|false|null|{obj}|{arr})"


# --------------------------------------------------------------------------- numeric ranges
def int_range_regex(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the JSON integers in [lo, hi] (None = unbounded)."""
    parts: list[str] = []
    if lo is None or lo < 0:  # negative values: -(|v|) with |v| in [max(1, -hi), -lo]
        a = 1 if hi is None or hi >= 0 else -hi
        b = None if lo is None else -lo
        parts += ["-" + p for p in _nonneg_int_patterns(a, b)]
    if hi is None or hi >= 0:
        parts += _nonneg_int_patterns(max(lo or 0, 0), hi)
    return "|".join(parts)


def number_range_regex(lo: int | None, hi: int | None) -> str:
    """JSON numbers in [lo, hi] for integral lo/hi: integer part in range, then a fraction."""
    frac, zero_frac = r"(\.[0-9]+)?", r"(\.0+)?"
    parts: list[str] = []
    if lo is None or lo < 0:  # negative side: |v| in (max(0,-hi), -lo]  or  [-hi, -lo]
        a = 0 if hi is None or hi >= 0 else -hi
        if lo is None:
            parts += ["-" + p + frac for p in _nonneg_int_patterns(a, None)]
        else:
            if a <= -lo - 1:
                parts += ["-" + p + frac for p in _nonneg_int_patterns(a, -lo - 1)]
            parts.append("-" + str(-lo) + zero_frac)
    if hi is None or hi >= 0:
        start = max(lo if lo is not None else 0, 0)
        if hi is None:
            parts += [p + frac for p in _nonneg_int_patterns(start, None)]
        else:
            if start <= hi - 1:
                parts += [p + frac for p in _nonneg_int_patterns(start, hi - 1)]
            parts.append(str(hi) + zero_frac)
    return "|".join(f"({p})" for p in parts)


def _nonneg_int_patterns(lo: int, hi: int | None) -> list[str]:
    """Alternatives matching the integers in [lo, hi], lo >= 0, written without leading 0s."""
    if hi is not None and lo > hi:
        return []
    out: list[str] = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for digits in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(top, 10**digits - 1)
        if a <= b:
            out += _same_length(str(a), str(b))
    if hi is None:
        out.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return out


def _same_length(a: str, b: str) -> list[str]:
    """Patterns for the numbers a..b written with the same number of digits (a <= b)."""
    if a == b:
        return [a]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + p for p in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    out: list[str] = []
    first_lo, first_hi = a[0], b[0]
    if a[1:] != "0" * n:
        out += [a[0] + p for p in _same_length(a[1:], "9" * n)]
        first_lo = chr(ord(a[0]) + 1)
    tail_hi = b[1:] != "9" * n
    if tail_hi:
        first_hi = chr(ord(b[0]) - 1)
    if first_lo <= first_hi:
        head = first_lo if first_lo == first_hi else f"[{first_lo}-{first_hi}]"
        out.append(head + f"[0-9]{{{n}}}")
    if tail_hi:
        out += [b[0] + p for p in _same_length("0" * n, b[1:])]
    return out


def regex_literal(text: str) -> str:
    """Escape `text` for the regex dialect Outlines understands."""
    special = set(r"\.^$|?*+()[]{}/")
    return "".join("\\" + c if c in special else c for c in text)


def require_regex_text(regex: object, what: str) -> str:
    """A client's regex as text within bounds, or InvalidRequest (400)."""
    if not isinstance(regex, str) or not regex:
        raise InvalidRequest(f"{what} must be a non-empty string", param=what)
    if len(regex) > MAX_REGEX_CHARS:
        raise InvalidRequest(
            f"{what} is too long ({len(regex):,} characters, limit {MAX_REGEX_CHARS:,})",
            param=what,
            code="schema_too_complex",
        )
    return regex
