"""A client's Lark grammar for a text, as an llguidance grammar for that text *written as the
body of a JSON string* - how a custom (free-form) tool's text is constrained inside our
tool-call envelope, ``{"name": "apply_patch", "arguments": {"input": "<text>"}}``.

`json_string_rules` rewrites the grammar token by token: rule and terminal names become
prefixed rule names (several grammars live in one turn's grammar); every string literal becomes the
literal of its JSON-escaped text; every regex is parsed (Python's own parser, the syntax
Lark uses) and written again so that each character it admits is admitted in its JSON form
(``"`` as ``\\"``, ``\\`` as ``\\\\``, newline, tab and carriage return as ``\\n``, ``\\t``,
``\\r``; other control characters are left out - a stricter grammar, never a looser one);
``%import common.X`` becomes a definition of X. What it cannot rewrite faithfully
(case-insensitive literals and regexes, look-around, back-references, ``%ignore``,
templates, character ranges of literals) raises `LarkUnsupported`: the caller then leaves
the text unconstrained and says so.
"""

from __future__ import annotations

import functools
import json
import re
import re._constants as sre_c  # the regex AST of Python's `re` (Lark's own regex syntax)
import re._parser as sre_parse
from dataclasses import dataclass
from typing import Any

#: The key of a tool's parameters that carries a Lark grammar for its one string ``input``
#: (a Responses ``custom`` tool; `loopstack.serving.http.responses.translate`); the guidance backend
#: enforces it.
LARK_KEY = "x-loopstack-lark"
STRING_HEAD, STRING_TAIL = '{"input": "', '"}'  # the arguments around the text
MAX_CODE = 0x10FFFF
_ESCAPES = '"\\\n\t\r'  # written as two characters in a JSON string; other controls: left out
# lark's common.lark terminals, as regexes
_COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(\r?\n)+",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[A-Za-z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
}
_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+)
      | (?P<comment>//[^\n]*)
      | (?P<import>%import[ \t]+common[ \t]*(?:\.[ \t]*[A-Z_]+|\([^)\n]*\))[^\n]*)
      | (?P<directive>%[a-z]+[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
      | (?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
      | (?P<alias>->[ \t]*[_a-zA-Z][_a-zA-Z0-9]*)
      | (?P<name>[?!]?[_a-zA-Z][_a-zA-Z0-9]*(?:\.-?[0-9]+)?)
      | (?P<range>\.\.)
      | (?P<number>[0-9]+)
      | (?P<punct>[:|()\[\]?*+~,])
    """,
    re.VERBOSE,
)


class LarkUnsupported(ValueError):
    """The grammar uses what cannot be rewritten for a JSON string."""


@dataclass(frozen=True)
class StringRules:
    """A grammar's rules for its text as a JSON string body: ``start`` names the rule."""

    start: str
    rules: str


@functools.lru_cache(maxsize=32)
def json_string_rules(definition: str, prefix: str) -> StringRules:
    """`definition` (Lark, its ``start`` rule the whole text) for its text JSON-escaped,
    every name a rule's, prefixed with `prefix`. Raises only `LarkUnsupported`."""
    try:
        return _rewrite(definition, prefix)
    except LarkUnsupported:
        raise
    except (ValueError, OverflowError, RecursionError, re.error) as exc:
        raise LarkUnsupported(f"cannot read the grammar: {str(exc)[:200]}") from None


def _rewrite(definition: str, prefix: str) -> StringRules:
    out: list[str] = []
    imported: dict[str, str] = {}
    pos = 0
    while pos < len(definition):
        m = _TOKEN.match(definition, pos)
        if m is None:
            raise LarkUnsupported(f"cannot read the grammar at {definition[pos : pos + 30]!r}")
        pos = m.end()
        kind, text = m.lastgroup, m.group()
        if kind in ("comment", "alias"):
            continue
        if kind == "space":
            out.append("\n" if "\n" in text else " ")
        elif kind == "import":
            for name in re.findall(r"[A-Z_]+", text.split("common", 1)[1]):
                if name not in _COMMON:
                    raise LarkUnsupported(f"%import common.{name} is not supported")
                imported[name] = _COMMON[name]
            pieces = text.split("->")
            if len(pieces) > 1:
                raise LarkUnsupported("%import with an alias is not supported")
        elif kind == "directive":
            raise LarkUnsupported(f"{text.split()[0]} is not supported")
        elif kind == "string":
            if text.endswith("i"):
                raise LarkUnsupported("case-insensitive literals are not supported")
            out.append(_literal(json.loads(text)))
        elif kind == "regex":
            body, _, flags = text[1:].rpartition("/")
            out.append(json_regex(body.replace("\\/", "/"), flags))
        elif kind == "name":
            out.append(_name(text, prefix))
        elif kind == "range":
            raise LarkUnsupported('literal ranges ("a".."z") are not supported')
        else:
            out.append(text)
    for name, pattern in imported.items():
        out.append(f"\n{_name(name, prefix)}: {json_regex(pattern, '')}")
    rules = "".join(out).strip()
    if not re.search(rf"(^|\n){re.escape(prefix)}start\s*:", rules):
        raise LarkUnsupported("the grammar has no start rule")
    return StringRules(prefix + "start", rules + "\n")


def _name(text: str, prefix: str) -> str:
    """Every name becomes a rule's (a terminal's text is now several lexemes); modifiers
    and priorities are dropped."""
    name = text.lstrip("?!").split(".")[0]
    return prefix + ("t_" + name.lower() if name[0].isupper() else name)


def _literal(text: str) -> str:
    return json.dumps(json.dumps(text, ensure_ascii=False)[1:-1], ensure_ascii=False)


# --------------------------------------------------------------------------- regexes
def json_regex(pattern: str, flags: str = "") -> str:
    """A regex (Python syntax) as a Lark expression of its strings in JSON-escaped form.

    An expression of one-character lexemes, not one regex lexeme: llguidance's lexemes are
    greedy, and a JSON-escaped text lexeme that may hold ``\\\\`` cannot end where the
    next one begins with a backslash (``\\n`` of a line feed) - the parser, not the lexer,
    must decide where the text ends."""
    if set(flags) - set("sx"):
        raise LarkUnsupported(f"regex flags {flags!r} are not supported")
    re_flags = (re.DOTALL if "s" in flags else 0) | (re.VERBOSE if "x" in flags else 0)
    try:
        parsed = sre_parse.parse(pattern, re_flags)
    except re.error as exc:
        raise LarkUnsupported(f"regex {pattern!r}: {exc}") from None
    expr = _seq(list(parsed), dotall=bool(re_flags & re.DOTALL))
    if not expr:
        raise LarkUnsupported(f"regex {pattern!r} matches only the empty string")
    return "(" + expr + ")"


def _seq(items: list[tuple[Any, Any]], *, dotall: bool) -> str:
    parts: list[str] = []
    run = ""  # consecutive literal characters: one string literal
    for op, av in items:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        if run:
            parts.append(_literal(run))
            run = ""
        part = _node(op, av, dotall=dotall)
        if part:
            parts.append(part)
    if run:
        parts.append(_literal(run))
    return " ".join(parts)


def _node(op: Any, av: Any, *, dotall: bool) -> str:
    if op is sre_c.NOT_LITERAL:
        return _chars(_complement([(av, av)]))
    if op is sre_c.ANY:
        return _chars([(0, MAX_CODE)] if dotall else _complement([(10, 10)]))
    if op is sre_c.IN:
        return _chars(_class(av))
    if op is sre_c.CATEGORY:
        return _chars(_category(av))
    if op is sre_c.SUBPATTERN:
        inner = _seq(list(av[-1]), dotall=dotall)
        return f"({inner})" if inner else ""
    if op is sre_c.BRANCH:
        branches = [_seq(list(b), dotall=dotall) for b in av[1]]
        kept = [b for b in branches if b]
        if not kept:
            return ""
        return "(" + " | ".join(kept) + ")" + ("?" if len(kept) < len(branches) else "")
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
        low, high, sub = av
        inner = _seq(list(sub), dotall=dotall)
        return f"({inner}){_quantifier(low, high)}" if inner else ""
    if op is sre_c.AT and av in (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING, sre_c.AT_END,
                                 sre_c.AT_END_STRING):  # fmt: skip
        return ""  # a terminal matches whole anyway
    raise LarkUnsupported(f"regex feature {op} is not supported")


def _quantifier(low: int, high: int) -> str:
    if high is sre_c.MAXREPEAT or high == sre_c.MAXREPEAT:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _class(items: list[tuple[Any, Any]]) -> list[tuple[int, int]]:
    negate = bool(items) and items[0][0] is sre_c.NEGATE
    spans: list[tuple[int, int]] = []
    for op, av in items[1:] if negate else items:
        if op is sre_c.LITERAL:
            spans.append((av, av))
        elif op is sre_c.RANGE:
            spans.append(av)
        elif op is sre_c.CATEGORY:
            spans += _category(av)
        else:
            raise LarkUnsupported(f"character class item {op} is not supported")
    return _complement(spans) if negate else _merge(spans)


_DIGIT = [(48, 57)]
_SPACE = [(9, 13), (32, 32)]
_WORD = [(48, 57), (65, 90), (95, 95), (97, 122)]


def _category(cat: Any) -> list[tuple[int, int]]:
    plain = {sre_c.CATEGORY_DIGIT: _DIGIT, sre_c.CATEGORY_SPACE: _SPACE,
             sre_c.CATEGORY_WORD: _WORD}  # fmt: skip
    negated = {sre_c.CATEGORY_NOT_DIGIT: _DIGIT, sre_c.CATEGORY_NOT_SPACE: _SPACE,
               sre_c.CATEGORY_NOT_WORD: _WORD}  # fmt: skip
    if cat in plain:
        return plain[cat]
    if cat in negated:
        return _complement(negated[cat])
    raise LarkUnsupported(f"regex category {cat} is not supported")


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, at = [], 0
    for lo, hi in _merge(spans):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return out


def _minus(spans: list[tuple[int, int]], cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    keep = _complement(cut)
    out = []
    for lo, hi in spans:
        for klo, khi in keep:
            a, b = max(lo, klo), min(hi, khi)
            if a <= b:
                out.append((a, b))
    return out


_NOT_PLAIN = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)]


def _chars(spans: list[tuple[int, int]]) -> str:
    """One character of `spans`, as it is written inside a JSON string: a one-character
    lexeme, or a two-character escape."""
    spans = _merge(spans)
    alts = []
    plain = _minus(spans, _NOT_PLAIN)
    if plain:
        alts.append("/[" + "".join(_span(lo, hi) for lo, hi in plain) + "]/")
    for ch in _ESCAPES:
        if any(lo <= ord(ch) <= hi for lo, hi in spans):
            alts.append(_literal(ch))
    if not alts:
        raise LarkUnsupported("a character class admits no character a JSON string can hold")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _span(lo: int, hi: int) -> str:
    return f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}"
