"""Write-back: redaction, promotion gate, corrections, poisoned conclusions, decay."""

from __future__ import annotations

import time

import pytest

from loopstack.memory import AsyncMemoryStore, Turn
from loopstack.memory.records import MemorySource
from loopstack.memory.writeback import (
    correction,
    explicit_request,
    forget_request,
    plan_turn,
    redact,
    self_statements,
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("my card is 4111 1111 1111 1111 thanks", "card_number"),
        ("card 5500-0000-0000-0004 expires soon", "card_number"),
        ("use sk-proj-abcdefghijklmnop1234567890 for the API", "api_key"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE in the config", "api_key"),
        ("my password is hunter2!", "password"),
        ("password: Tr0ub4dor&3", "password"),
        ("the wifi password hunter22 works", "password"),
    ],
)
def test_redaction_removes_secrets(text: str, kind: str) -> None:
    out, kinds = redact(text)
    assert kind in kinds
    assert f"[REDACTED:{kind}]" in out
    for secret in ("4111", "5500", "abcdefghijklmnop", "AKIAIOSFODNN7", "hunter2", "Tr0ub4dor"):
        assert secret not in out


@pytest.mark.parametrize(
    "text",
    [
        "order 1234567890123 shipped",  # 13 digits but fails Luhn
        "call me at 555 0100",
        "the secret plan is fine",  # 'secret plan' is not a credential
        "my password manager is great",
    ],
)
def test_redaction_leaves_ordinary_text(text: str) -> None:
    assert redact(text) == (text, [])


def test_detectors() -> None:
    assert explicit_request("Please remember that I'm allergic to peanuts.") == (
        "I'm allergic to peanuts"
    )
    assert explicit_request("what's the weather") is None
    assert correction("Actually, my flight is on Tuesday, not Monday") == (
        "My flight is on Tuesday, not Monday"
    )
    assert correction("actually") is None
    assert forget_request("Don't remember my card number") == "card number"
    assert forget_request("please forget that I live in Berlin") == "I live in Berlin"
    assert self_statements("Hi! I live in Lisbon. What time is it?") == ["I live in Lisbon"]


def test_plan_turn_conclusion_without_evidence_is_low_weight() -> None:
    props = plan_turn(Turn(task_conclusion="The API rate limit is 100 requests per minute"))
    assert props[0].kind == "conclusion" and props[0].weight == 0.3
    # an id alone is no proof: memory cannot check it (kept, marked unchecked)
    props = plan_turn(
        Turn(task_conclusion="The API rate limit is 100 requests per minute", evidence=["tool:7"])
    )
    assert props[0].weight == 0.3 and props[0].evidence == ["unchecked:tool:7"]
    # the cited result holds the value: evidence-backed, tied to that result only
    props = plan_turn(
        Turn(
            task_conclusion="The API rate limit is 100 requests per minute",
            observations={"tool:7": '{"rate_limit_per_minute": 100}', "tool:8": '{"ok": 1}'},
        )
    )
    assert props[0].weight is None and props[0].evidence == ["tool:7"]


async def test_explicit_remember_is_stored_high_weight(store: AsyncMemoryStore) -> None:
    res = await store.write_back(
        Turn(user_message="Remember that my preferred editor is Helix"), user_id="u1"
    )
    assert [r.action for r in res] == ["stored"]
    rec = await store.get(res[0].id or "", user_id="u1")
    assert rec.text == "My preferred editor is Helix"
    assert rec.weight == store.settings.explicit_weight
    assert rec.source == MemorySource.USER_EXPLICIT


async def test_fact_repeated_three_times_is_promoted(store: AsyncMemoryStore) -> None:
    msgs = ["I work at Acme Robotics.", "Well, I work at Acme Robotics", "i work at acme robotics!"]
    actions = []
    for m in msgs:
        res = await store.write_back(Turn(user_message=m), user_id="u1")
        actions.append(res[0].action)
    assert actions == ["observed", "observed", "promoted"]
    listed = await store.list(user_id="u1")
    assert len(listed) == 1 and listed[0].source == MemorySource.INFERRED
    # a fourth mention is a duplicate of the kept record, not a new one
    res = await store.write_back(Turn(user_message="I work at Acme Robotics"), user_id="u1")
    assert res[0].action == "duplicate" and len(await store.list(user_id="u1")) == 1


async def test_single_mention_is_not_kept(store: AsyncMemoryStore) -> None:
    res = await store.write_back(Turn(user_message="I have a meeting at 3"), user_id="u1")
    assert res[0].action == "observed"
    assert await store.list(user_id="u1") == []


async def test_correction_supersedes(store: AsyncMemoryStore) -> None:
    old = await store.add("My flight to Oslo is on Monday", user_id="u1")
    res = await store.write_back(
        Turn(user_message="Actually, my flight to Oslo is on Tuesday"), user_id="u1"
    )
    assert res[0].action == "superseded" and res[0].superseded == old
    chain = await store.history(old, user_id="u1")
    assert [r.text for r in chain] == [
        "My flight to Oslo is on Monday",
        "My flight to Oslo is on Tuesday",
    ]
    assert chain[0].superseded_by == chain[1].id


async def test_forget_request_deletes(store: AsyncMemoryStore) -> None:
    await store.add("My card number ends with 4242", user_id="u1")
    keep = await store.add("My favourite tea is oolong", user_id="u1")
    res = await store.write_back(Turn(user_message="Don't remember my card number"), user_id="u1")
    assert res[0].action == "forgotten"
    assert [r.id for r in await store.list(user_id="u1")] == [keep]


async def test_secrets_never_reach_the_ledger(store: AsyncMemoryStore) -> None:
    res = await store.write_back(
        Turn(user_message="Remember my card 4111 1111 1111 1111 for the hotel booking"),
        user_id="u1",
    )
    assert res[0].action == "stored"
    rec = await store.get(res[0].id or "", user_id="u1")
    assert "4111" not in rec.text and "[REDACTED:card_number]" in rec.text
    row = store.ledger._reader.execute("SELECT group_concat(text) FROM records").fetchone()
    assert "4111" not in row[0]


async def test_decay_lowers_weight_and_prunes_inferred(store: AsyncMemoryStore) -> None:
    year_ago = time.time() - 365 * 86400
    a = await store.add(
        "User once mentioned liking jazz",
        user_id="u1",
        source="inferred",
        weight=0.2,
        created_at=year_ago,
    )
    b = await store.add("User's name is Dana", user_id="u1", created_at=year_ago)
    c = await store.add("User is reviewing the Q3 budget", user_id="u1", source="inferred")
    out = await store.decay()
    assert out["pruned"] == 1
    ids = {r.id for r in await store.list(user_id="u1")}
    assert ids == {b, c} and a not in ids
    wb = (await store.get(b, user_id="u1")).weight
    assert wb == pytest.approx(0.5 ** (365 / 180), rel=0.01)  # decayed but explicit: kept
    assert (await store.get(c, user_id="u1")).weight == pytest.approx(1.0, rel=1e-3)
    # a second run right away decays (almost) nothing more: no double counting
    await store.decay()
    assert (await store.get(b, user_id="u1")).weight == pytest.approx(wb, rel=1e-3)
