"""Redaction corpus: common token and key formats, credentials in URLs, "pw is ...",
national ID numbers - in texts and in evidence ids - and ordinary text left alone: a few
hundred sentences of everyday English and Chinese that use the rules' cue words (pin, pass,
key, token, secret, 密码, numbers, dates; ``data/ordinary_prose_*.txt``) and, where the
data is present, all 5,882 turns of LoCoMo (issue #58)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopstack.memory import AsyncMemoryStore, Turn
from loopstack.memory.redaction import redact

# (text, the secret that must disappear, kind)
SECRETS = [
    (
        "stripe key sk_live_4eC39HqLyjWDarjtT1zdp7dc for billing",
        "4eC39HqLyjWDarjtT1zdp7dc",
        "api_key",
    ),
    ("test with sk_test_51HxYzAbCdEfGhIjKl0123", "51HxYzAbCdEfGhIjKl0123", "api_key"),
    ("restricted rk_live_abcdefGHIJKL12345678", "abcdefGHIJKL12345678", "api_key"),
    ("hf token hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "AbCdEfGhIjKlMnOpQrStUvWxYz012345", "api_key"),
    (
        "use ghu_16C7e42F292c6912E7710c838347Ae178B4a",
        "16C7e42F292c6912E7710c838347Ae178B4a",
        "api_key",
    ),
    (
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789 is mine",
        "abcdefghijklmnopqrstuvwxyz012345",
        "api_key",
    ),
    ("server token ghs_AAAABBBBCCCCDDDDEEEEFFFF00001111", "AAAABBBBCCCCDDDDEEEE", "api_key"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "11ABCDEFG0123456789", "api_key"),
    ("gitlab glpat-xxxxXXXXyyyyYYYY1234", "xxxxXXXXyyyyYYYY1234", "api_key"),
    (
        "npm_abcdefghijklmnopqrstuvwxyz0123456789 publishes",
        "abcdefghijklmnopqrstuvwxyz0123",
        "api_key",
    ),
    ("openai sk-proj-abcdefghijklmnop1234567890", "abcdefghijklmnop1234567890", "api_key"),
    ("anthropic sk-ant-api03-abcdefghijklmnopqrstuv", "abcdefghijklmnopqrstuv", "api_key"),
    ("aws AKIAIOSFODNN7EXAMPLE in the config", "AKIAIOSFODNN7EXAMPLE", "api_key"),
    ("temp key ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A", "api_key"),
    (
        "aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "api_key",
    ),
    (
        "the secret is in there: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY ok",
        "K7MDENG/bPxRfiCY",
        "api_key",
    ),
    ("slack xoxb-1234567890-abcdefghij", "1234567890-abcdefghij", "api_key"),
    ("maps AIzaSyA-1234567890abcdefghijklmnopqrstu", "SyA-1234567890abcdefghij", "api_key"),
    ("Authorization: Bearer abcDEF123456ghiJKL789", "abcDEF123456ghiJKL789", "token"),
    (
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
        "jwt",
    ),
    ("db is postgres://admin:S3cr3tPass@db.internal:5432/app", "S3cr3tPass", "url_credentials"),
    ("clone https://bob:ghpwd12345@git.example.com/x.git", "ghpwd12345", "url_credentials"),
    ("redis://:hunter2hunter2@cache:6379/0", "hunter2hunter2", "url_credentials"),
    ("mongodb+srv://app:p%40ss!word@cluster0.mongodb.net", "p%40ss!word", "url_credentials"),
    ("my pw is hunter2", "hunter2", "password"),
    ("the wifi pw: correcthorse", "correcthorse", "password"),
    ("My password is hunter2!", "hunter2", "password"),
    ("password: Tr0ub4dor&3", "Tr0ub4dor&3", "password"),
    ("the password for the router is admin1234", "admin1234", "password"),
    ("passcode is 8812", "8812", "password"),
    ("PIN code: 4471", "4471", "password"),
    ("api key = abcd1234efgh", "abcd1234efgh", "password"),
    ("the wifi password hunter22 works", "hunter22", "password"),
    ("my SSN is 123-45-6789", "123-45-6789", "national_id"),
    ("SSN: 078-05-1120 on file", "078-05-1120", "national_id"),
    ("file says 219-09-9999 for him", "219-09-9999", "national_id"),
    ("social security number is 536 22 1234", "536", "national_id"),
    ("my NI number is AB 12 34 56 C", "12 34 56", "national_id"),
    ("NI AB 12 34 56 C on the payslip", "AB 12 34 56", "national_id"),
    ("national insurance number: AB123456C", "AB123456C", "national_id"),
    ("passport number is X12345678", "X12345678", "national_id"),
    ("my national ID is 12345678Z", "12345678Z", "national_id"),
    ("tax id: DE123456789", "123456789", "national_id"),
    ("card 4111 1111 1111 1111 thanks", "4111 1111", "card_number"),
    ("我的卡号是4111111111111111，谢谢", "4111111111111111", "card_number"),
    ("card: 5500-0000-0000-0004.", "5500-0000-0000", "card_number"),
    ("IBAN DE89 3704 0044 0532 0130 00", "3704 0044", "iban"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA",
        "private_key",
    ),
]

# Near misses of the prose rules: a plain-word password that closes its clause, a PIN after
# "pin ... is", a key in mixed case, and the Chinese forms.
MORE_SECRETS = [
    ("my password is swordfish.", "swordfish", "password"),
    ("My password is swordfish and my PIN is 4471", "swordfish", "password"),
    ("My password is swordfish and my PIN is 4471", "4471", "password"),
    ("the password for wifi.example.com is CorrectHorse", "CorrectHorse", "password"),
    ('my password is "swordfish" now', "swordfish", "password"),
    ("the passphrase is Tr0ub4dor", "Tr0ub4dor", "password"),
    ("my pw: letmein", "letmein", "password"),
    ("pin number: 123456", "123456", "password"),
    ("the pin to the safe is 2580", "2580", "password"),
    ("PIN is 0000", "0000", "password"),
    ("the token is 'abc123def456'", "abc123def456", "password"),
    ("secret = s3cr3t-v4lue", "s3cr3t-v4lue", "password"),
    ("access key: AbCdEfGhIjKl", "AbCdEfGhIjKl", "password"),
    ("my passport number is E12345678", "E12345678", "national_id"),
    ("card 3782 822463 10005 (amex)", "822463", "card_number"),
    ("我的密码是hunter2", "hunter2", "password"),
    ("wifi密码：CorrectHorse99", "CorrectHorse99", "password"),
    ("验证码是 482913，五分钟内有效", "482913", "password"),
    ("支付密码为 8812", "8812", "password"),
    ("PIN码：4471", "4471", "password"),
    ("我的身份证号是110101199003074514，别告诉别人", "110101199003074514", "national_id"),
    ("护照号码：E12345678", "E12345678", "national_id"),
]

ORDINARY = [
    "order 1234567890123 shipped",
    "call me at 555 0100",
    "the secret plan is fine",
    "my password manager is great",
    "commit 3f2a9c1d4e5b6a7980c1d2e3f4a5b6c7d8e9f0a1 fixed it",
    "I moved to https://example.com/docs/page last week",
    "visit http://localhost:8000/health",
    "meeting on 2026-12-01 at 10:30",
    "the ticket is PROJ-1234",
    "my phone is +1 415 555 0100",
    "I have 3 kids and 2 dogs",
    "skills include sk8boarding",
    "Our hf team uses transformers",
    "standup is at 10am",
    "The API key of the user is scoped to the staging project",
    "the token was revoked yesterday",
    "my password is expired again",
    # agent trace ids (evidence ids): 18 digits that pass Luhn, glued to the hex tail
    "20261205-004202-3546ebd4",
    "20261205-004202-3546ebd4.1.0",
    "see trace 20261205-004202-3546ebd4 step 2",
    # grouped like a phone number or an ISBN, not like a card (whatever the checksum)
    "call +86 138 0013 8000 after six",
    "ISBN 978-0-306-40615-7",
]

DATA = Path(__file__).resolve().parent / "data"
PROSE = [
    line
    for name in ("ordinary_prose_en.txt", "ordinary_prose_zh.txt")
    for line in (DATA / name).read_text(encoding="utf-8").splitlines()
    if line.strip() and not line.startswith("#")
]
# The sentence issue #58 found stored as "Is [REDACTED:password] your favorite superhero"
# (LoCoMo conversation 42, turn D15:2).
SPIDERMAN = (
    "Nate: Congrats, Joanna! Seeing your hard work pay off like that must've felt amazing. I "
    "bet it was scary too, but awesome! You're so inspiring. By the way, last time we saw "
    "eachother, I noticed a spiderman pin on your purse. Is Spider-Man your favorite "
    "superhero, or do you have another fave?"
)


def test_corpus_size() -> None:
    assert len(SECRETS) >= 40 and len({k for _, _, k in SECRETS}) >= 8
    assert len(PROSE) >= 350 and sum(1 for p in PROSE if "密码" in p) >= 10


@pytest.mark.parametrize(("text", "secret", "kind"), SECRETS + MORE_SECRETS)
def test_secret_is_redacted(text: str, secret: str, kind: str) -> None:
    out, kinds = redact(text)
    assert secret not in out, out
    assert kind in kinds and f"[REDACTED:{kind}]" in out, (out, kinds)


@pytest.mark.parametrize("text", ORDINARY + PROSE)
def test_ordinary_text_survives(text: str) -> None:
    assert redact(text) == (text, [])


def test_the_spiderman_pin_is_prose() -> None:
    assert redact(SPIDERMAN) == (SPIDERMAN, [])
    # the same words with a PIN in them are still a secret
    out, kinds = redact("I noticed a spiderman pin on your purse. The pin is 4471, by the way")
    assert "4471" not in out and kinds == ["password"], out


def test_locomo_turns_pass_unchanged() -> None:
    """0 redactions on LoCoMo's 5,882 turns (not committed, CC BY-NC 4.0: see
    loopstack/bench/memory/data/README.md; ``python -m loopstack.bench.memory.redaction`` prints the
    count)."""
    from loopstack.bench.memory.locomo import DATA as LOCOMO
    from loopstack.bench.memory.redaction import locomo_redactions

    if not LOCOMO.is_file():
        pytest.skip(f"LoCoMo not present at {LOCOMO}")
    turns, changed = locomo_redactions(LOCOMO)
    assert turns == 5882
    assert changed == [], changed[:5]


async def test_evidence_is_redacted_in_records_and_write_back(store: AsyncMemoryStore) -> None:
    rid = await store.add(
        "The deploy uses the staging database",
        user_id="u1",
        source="task",
        evidence=["tool:psql postgres://ops:Sup3rS3cret@db/app", "tool:env#2"],
    )
    rec = await store.get(rid, user_id="u1")
    assert all("Sup3rS3cret" not in e for e in rec.evidence)
    assert "[REDACTED:url_credentials]" in rec.evidence[0]
    res = await store.write_back(
        Turn(
            task_conclusion="The order total is 40 dollars",
            evidence=["tool:get_order token is sk_live_4eC39HqLyjWDarjtT1zdp7dc"],
        ),
        user_id="u1",
    )
    got = await store.get(res[0].id or "", user_id="u1")
    assert "4eC39Hq" not in " ".join(got.evidence)
    rec2 = await store.recall("order total", user_id="u1")
    assert "4eC39Hq" not in rec2.block and "Sup3rS3cret" not in rec2.block
