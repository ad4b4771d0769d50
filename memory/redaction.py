"""Redaction: secrets are replaced by ``[REDACTED:<kind>]`` before a text is embedded,
stored, logged or sent to the model (record texts *and* evidence ids).

Covered (tests/unit/memory/test_memory_redaction.py holds the corpus): payment card numbers
(13-19 digits, Luhn-checked), API keys and tokens (OpenAI/Anthropic ``sk-``, Stripe
``sk_live_``/``rk_test_``..., Hugging Face ``hf_``, GitHub ``ghp_``/``gho_``/``ghu_``/``ghs_``/
``ghr_``/``github_pat_``, GitLab ``glpat-``, npm ``npm_``, AWS ``AKIA``/``ASIA`` key ids and
40-character secret keys, Slack ``xox*-``, Google ``AIza``), ``Bearer`` tokens, JWTs,
private-key blocks, IBANs, credentials inside URLs (``scheme://user:PASSWORD@host``),
``password|passwd|pw|pin|passcode|secret|token|api key [for X] is|=|: VALUE`` and national
ID numbers (US SSN, UK NI number, and any value after "SSN", "social security number",
"national ID", "passport number", "tax ID" ...).
"""

from __future__ import annotations

import re

__all__ = ["only_redactions", "redact"]

# Not glued to ASCII letters, digits, "_" or "-" on either side: a trace id such as
# 20261205-004202-3546ebd4 holds 18 digits that pass Luhn one time in ten, and is no card.
# (Chinese text may touch the number: 卡号4111111111111111 is still a card.)
_CARD = re.compile(r"(?<![A-Za-z0-9_-])(?:\d[ -]?){12,18}\d(?![A-Za-z0-9_-])")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_KEYWORD_VALUE = (
    r"(\s*(?:\s+(?:for|of|to|on)\s+(?:the\s+|my\s+)?[\w.@-]+(?:\s+[\w.@-]+)?\s*)?"
    r"(?:is|was|=|:|->)\s*)([\"']?)(\S{3,})\3"
)
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "private_key",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
        ),
    ),
    ("url_credentials", re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")),
    ("api_key", re.compile(r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9_-]{2,}-)?[A-Za-z0-9_-]{16,}")),
    ("api_key", re.compile(r"\b(?:sk|pk|rk|whsec)_(?:live|test)_[A-Za-z0-9]{8,}\b")),
    ("api_key", re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")),
    ("api_key", re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{20,}\b")),
    ("api_key", re.compile(r"\b(?:glpat-[A-Za-z0-9_-]{20,}|npm_[A-Za-z0-9]{30,})\b")),
    ("api_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("api_key", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b")),
    ("token", re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]{16,}=*")),
    (
        "password",
        re.compile(
            r"(?i)\b(pass(?:word|wd|phrase|code)?|pwd|pw|pin(?: code| number)?|secret"
            r"|token|api[ _-]?key|access[ _-]?key|secret[ _-]?key)" + _KEYWORD_VALUE
        ),
    ),
    (
        "password",
        # "password hunter2!": a bare value right after the word, if it looks like one
        re.compile(r"(?i)\b(pass(?:word|wd|phrase)?|pwd|pw)(\s+)()(?=\S*[^\sA-Za-z])(\S{4,})"),
    ),
    (
        "national_id",
        re.compile(
            r"(?i)\b(ssn|social security(?: number| no\.?)?|national (?:id|insurance)"
            r"(?: number| no\.?)?|ni number|passport(?: number| no\.?)|tax (?:id|number)"
            r"|personal id(?: number)?|id number)"
            + _KEYWORD_VALUE.replace(
                r"(\S{3,})", r"([A-Z0-9]{1,4}(?:[ -]?\d{2,6}){1,4}(?:[ -]?[A-Z]\b)?|\S{4,})"
            )
        ),
    ),
    ("national_id", re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")),
    (
        "national_id",
        re.compile(r"\b(?![DFIQUV])[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b"),
    ),
    ("iban", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b")),
]
_KEEP_PREFIX = {"password", "national_id", "url_credentials", "token"}
# "the API key of the user is scoped to ...", "the token was revoked": prose, not a secret.
_PROSE_VALUES = re.compile(
    r"^(?:[a-z]+(?:ed|ing|able)|valid|invalid|wrong|correct|set|empty|new|old|same|"
    r"different|fine|ok|okay|secure|weak|strong|long|short|there|here|not|the|an?|too|"
    r"still|now|also|only|just|very|stored|shared|secret|private|public|safe)$"
)


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _aws_secret_like(s: str) -> bool:
    """40 base64 characters with upper, lower and digits (a git SHA has no upper case)."""
    return (
        any(c.isupper() for c in s) and any(c.islower() for c in s) and any(c.isdigit() for c in s)
    )


def redact(text: str) -> tuple[str, list[str]]:
    """Replace secrets with ``[REDACTED:<kind>]``; returns (text, kinds found).

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
    for kind, pattern in _PATTERNS:

        def sub(m: re.Match[str], kind: str = kind) -> str:
            if "[REDACTED:" in m.group(0) and kind != "url_credentials":
                return m.group(0)
            if kind == "password" and m.lastindex == 4 and _PROSE_VALUES.match(m.group(4)):
                return m.group(0)
            kinds.append(kind)
            if kind == "url_credentials":
                return f"{m.group(1)}[REDACTED:{kind}]{m.group(3)}"
            if kind in _KEEP_PREFIX and m.lastindex and m.lastindex >= 2:
                return f"{m.group(1)}{m.group(2)}[REDACTED:{kind}]"
            if kind == "token":
                return f"{m.group(1)}[REDACTED:{kind}]"
            return f"[REDACTED:{kind}]"

        out = pattern.sub(sub, out)

    def aws(m: re.Match[str]) -> str:
        if not _aws_secret_like(m.group(0)):
            return m.group(0)
        kinds.append("api_key")
        return "[REDACTED:api_key]"

    out = _AWS_SECRET.sub(aws, out)
    return out, list(dict.fromkeys(kinds))


def only_redactions(text: str) -> bool:
    """True when, without the redaction markers, no real content is left."""
    rest = re.sub(r"\[REDACTED:[a-z_]+\]", " ", text)
    words = re.findall(r"[^\W_]{2,}", rest)
    return len(words) < 2
