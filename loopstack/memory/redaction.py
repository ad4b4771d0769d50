"""Redaction: secrets are replaced by ``[REDACTED:<kind>]`` before a text is embedded,
stored, logged or sent to the model (record texts *and* evidence ids).

Covered (tests/unit/memory/test_memory_redaction.py holds the corpus): payment card numbers
(13-19 digits, Luhn-checked, grouped as cards are), API keys and tokens (OpenAI/Anthropic
``sk-``, Stripe ``sk_live_``/``rk_test_``..., Hugging Face ``hf_``, GitHub ``ghp_``/``gho_``/
``ghu_``/``ghs_``/``ghr_``/``github_pat_``, GitLab ``glpat-``, npm ``npm_``, AWS ``AKIA``/
``ASIA`` key ids and 40-character secret keys, Slack ``xox*-``, Google ``AIza``), ``Bearer``
tokens, JWTs, private-key blocks, IBANs, credentials inside URLs
(``scheme://user:PASSWORD@host``), ``password|passwd|pw|pin|passcode|secret|token|api key
[for X] is|=|: VALUE``, ``密码/口令/验证码/密钥 是|为|： VALUE`` and national ID numbers (US
SSN, UK NI number, any value after "SSN", "social security number", "national ID",
"passport number", "tax ID" ..., and after 身份证号/护照号码).

Ordinary prose passes unchanged (``tests/unit/memory/data/ordinary_prose_*.txt``, and all
5,882 turns of LoCoMo: ``python -m loopstack.bench.memory.redaction``). A keyword is only a cue;
what follows it is redacted when it looks like the secret that keyword names:

* a PIN is 4-12 digits ("a spiderman pin on your purse. Is Spider-Man ..." is prose);
* an ID number holds a digit;
* after secret, token or a key, a value with a digit, a symbol or mixed case (a token or a
  key is never a plain word: "the secret is patience");
* after password, passcode, pw: the same, or a plain word that closes the clause and is not
  an everyday word ("my password is swordfish." but not "my password is longer than yours");
* the "for/of/to/on X" between a keyword and its value never crosses a sentence end.
"""

from __future__ import annotations

import re

__all__ = ["only_redactions", "redact"]

# Not glued to ASCII letters, digits, "_" or "-" on either side: a trace id such as
# 20261205-004202-3546ebd4 holds 18 digits that pass Luhn one time in ten, and is no card.
# (Chinese text may touch the number: 卡号4111111111111111 is still a card.)
_CARD = re.compile(r"(?<![A-Za-z0-9_-])(?:\d[ -]?){12,18}\d(?![A-Za-z0-9_-])")
# How card numbers are written when split: 4-4-4-4(-1..3), Amex 4-6-5, Diners 4-6-4. A phone
# number (+86 138 0013 8000), an ISBN (978-0-306-40615-7) or a tracking number in groups of
# other sizes is not a card, whatever its checksum.
_CARD_GROUPS = re.compile(r"\d{4}(?:[ -]\d{4}){2,3}(?:[ -]\d{1,3})?|\d{4}[ -]\d{6}[ -]\d{4,5}")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
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
    ("national_id", re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")),
    (
        "national_id",
        re.compile(r"\b(?![DFIQUV])[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b"),
    ),
    ("iban", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b")),
]

# --- a keyword, then its value ----------------------------------------------------------------
# "the password for the router is X": the words between keyword and value may hold a dot
# inside (wifi.example.com), never at their end, so "a pin on your purse. Is X" is no match.
_WORD = r"[\w@-]+(?:\.[\w@-]+)*"
_QUALIFIER = rf"(?:\s+(?:for|of|to|on)\s+(?:the\s+|my\s+)?{_WORD}(?:\s+{_WORD})?)?"
_SEP = r"\s*(?P<sep>(?:is|was)\b|=|:|->)\s*"
_VALUE = r"(?P<q>[\"']?)(?P<value>\S{3,})(?P=q)"
_PASS = r"pass(?:word|wd|phrase|code)|pwd|pw"
_KEYWORDS: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "password",
        "pin",
        re.compile(rf"(?i)(?P<head>\bpin(?: code| number)?{_QUALIFIER}{_SEP}){_VALUE}"),
    ),
    ("password", "pass", re.compile(rf"(?i)(?P<head>\b(?:{_PASS}){_QUALIFIER}{_SEP}){_VALUE}")),
    (
        "password",
        "key",
        re.compile(
            r"(?i)(?P<head>\b(?:pass|secret|token|api[ _-]?key|access[ _-]?key|secret[ _-]?key)"
            rf"{_QUALIFIER}{_SEP}){_VALUE}"
        ),
    ),
    # "the wifi password hunter22 works": a value right after the word, if it looks like one
    (
        "password",
        "bare",
        re.compile(r"(?i)(?P<head>\b(?:password|passwd|passphrase|pwd|pw)\s+)(?P<value>\S{4,})"),
    ),
    # 密码是 hunter2 / 验证码：482913 / 支付密码为 8812: an ASCII value after the word
    (
        "password",
        "zh",
        re.compile(
            r"(?P<head>(?:密码|口令|密钥|验证码|[Pp][Ii][Nn]码)\s*(?P<sep>是|为|：|:|=|＝)\s*)"
            r"(?P<value>[!-~]{3,})"
        ),
    ),
    # 身份证号是 110101199003074514 / 护照号码：E12345678
    (
        "national_id",
        "id",
        re.compile(
            r"(?P<head>(?:身份证|护照)(?:号码|号)?\s*(?P<sep>是|为|：|:)\s*)"
            r"(?P<value>\d{17}[\dXx]|\d{15}|[A-Za-z]{1,2}\d{7,9})(?![\dA-Za-z])"
        ),
    ),
    (
        "national_id",
        "id",
        re.compile(
            r"(?i)(?P<head>\b(?:ssn|social security(?: number| no\.?)?|national (?:id|insurance)"
            r"(?: number| no\.?)?|ni number|passport(?: number| no\.?)|tax (?:id|number)"
            rf"|personal id(?: number)?|id number){_QUALIFIER}{_SEP})(?P<q>[\"']?)"
            r"(?P<value>[A-Z0-9]{1,4}(?:[ -]?\d{2,6}){1,4}(?:[ -]?[A-Z]\b)?|\S{4,})(?P=q)"
        ),
    ),
]
# Words a password may be said to be ("my password is weak, the site says"), and the words
# that carry a clause on after one ("longer than", "was stolen in"): never a secret.
_PROSE_WORDS = frozenset(
    """a an the this that these those it its it's my your his her our their mine yours ours
    theirs me you him them us what which who whom whose something nothing anything everything
    one same different other another and but or so then than as because when where while if
    though not no yes never always still now also only just very too quite really pretty so
    here there in on at to of for from by with without under over above below into onto out
    off up down back away about around gone lost known set reset empty new old fine ok okay
    valid invalid wrong right correct secure insecure weak strong long short easy hard simple
    complex complicated safe unsafe good bad great terrible private public secret shared
    stored saved written taken stolen forgotten hidden shown given known leaked broken changed
    longer shorter better worse stronger weaker harder easier safer simpler bigger smaller
    case sensitive required optional mandatory unique random default same hint""".split()
)
_PROSE_SUFFIX = re.compile(r"^[a-z]+(?:ed|ing|able|ible|ly|ful|less|ous)$")
_CLAUSE_GOES_ON = re.compile(r"\s+(?!(?:and|but|or|so|then)\b)[a-z]")
_STRUCTURED = {"=", ":", "->", "：", "＝"}


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


def _core(value: str) -> str:
    """The value without the sentence punctuation or brackets around it."""
    return value.strip(".,;:!?()[]{}\"'“”‘’。，！？；")


def _token_like(core: str) -> bool:
    """A digit, a symbol inside (not a word's hyphen or apostrophe) or mixed case
    ("hUnter", "CorrectHorse"): the shape of a key, a token or a made-up password."""
    return bool(
        re.search(r"\d", core) or re.search(r"[^\w'’-]|_", core) or re.search(r"[a-z][A-Z]", core)
    )


def _is_secret(family: str, m: re.Match[str]) -> bool:
    value = m.group("value")
    core = _core(value)
    if "[REDACTED:" in m.group(0) or len(core) < 3:
        return False
    if family == "pin":
        return re.fullmatch(r"\d{4,12}", core) is not None
    if family == "id":
        return re.search(r"\d", core) is not None
    if family == "zh":
        return len(core) >= 3
    quoted = bool(m.groupdict().get("q"))
    if _token_like(core) or (quoted and family != "bare"):
        return True
    if family in ("key", "bare"):
        return False  # a plain word after "secret", "token", "pass" is prose
    word = core.lower()
    if word in _PROSE_WORDS or _PROSE_SUFFIX.match(word):
        return False
    rest = m.string[m.end() :]
    closes = core != value or not rest.strip() or _CLAUSE_GOES_ON.match(rest) is None
    return m.group("sep") in _STRUCTURED or closes


def redact(text: str) -> tuple[str, list[str]]:
    """Replace secrets with ``[REDACTED:<kind>]``; returns (text, kinds found).

    Card numbers are matched by shape (13-19 digits, written whole or in a card's groups)
    *and* the Luhn checksum, so ordinary long numbers survive.
    """
    kinds: list[str] = []

    def card(m: re.Match[str]) -> str:
        raw = m.group(0)
        digits = re.sub(r"\D", "", raw)
        grouped = raw.isdigit() or _CARD_GROUPS.fullmatch(raw) is not None
        if 13 <= len(digits) <= 19 and grouped and _luhn_ok(digits):
            kinds.append("card_number")
            return "[REDACTED:card_number]"
        return raw

    out = _CARD.sub(card, text)
    for kind, pattern in _PATTERNS:

        def sub(m: re.Match[str], kind: str = kind) -> str:
            if "[REDACTED:" in m.group(0) and kind != "url_credentials":
                return m.group(0)
            kinds.append(kind)
            if kind == "url_credentials":
                return f"{m.group(1)}[REDACTED:{kind}]{m.group(3)}"
            if kind == "token":
                return f"{m.group(1)}[REDACTED:{kind}]"
            return f"[REDACTED:{kind}]"

        out = pattern.sub(sub, out)
    for kind, family, pattern in _KEYWORDS:

        def keyword(m: re.Match[str], kind: str = kind, family: str = family) -> str:
            if not _is_secret(family, m):
                return m.group(0)
            kinds.append(kind)
            return f"{m.group('head')}[REDACTED:{kind}]"

        out = pattern.sub(keyword, out)

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
