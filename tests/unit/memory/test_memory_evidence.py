"""Checked evidence (loopstack.memory.evidence): a conclusion is backed only by results that hold
what it asserts; through the store, an unbacked conclusion never reaches the block. English and
Chinese."""

from __future__ import annotations

import json

import pytest

from loopstack.memory import AsyncMemoryStore, Turn
from loopstack.memory.evidence import check, claims, perishable
from loopstack.memory.trust import provenance
from loopstack.text import mentions

SALES = {
    "run1.s1.c0": json.dumps(
        {"status": "ok", "data": {"region": "EMEA", "q2_sales": 120000, "q3_sales": 95000}}
    ),
    "run1.s2.c0": json.dumps({"status": "ok", "data": {"weather": "sunny"}}),
}
ORDER = {
    "t#1": json.dumps(
        {"order": 5521, "customer": "Acme Corp", "delivered": "2026-03-03", "note": "“加急”"},
        ensure_ascii=False,
    )
}
ZH = {"t#2": json.dumps({"最大客户": "华东贸易公司", "第三季度销售额": 95000}, ensure_ascii=False)}


@pytest.mark.parametrize(
    ("conclusion", "obs", "backed"),
    [
        # supported: numbers with scale, a computed percentage, a date, an entity
        ("Q3 sales fell from 120k to 95k, a drop of 20.8%.", SALES, True),
        ("Q3 sales fell from 120,000 to 95,000.", SALES, True),
        ("Order 5521 from Acme Corp was delivered on March 3.", ORDER, True),
        ("第三季度销售额从12万降到了9.5万。", SALES, True),
        ("订单5521已于3月3日送达。", ORDER, True),
        ("最大客户是华东贸易公司，第三季度销售额为9.5万。", ZH, True),
        # the poisoning case: a cause no result holds, next to real figures
        ("Sales fell to 95k. The drop is mainly due to losing a big customer.", SALES, False),
        ("销售额降到了9.5万，下降主要是因为失去了一个大客户。", SALES, False),
        # a value no result holds
        ("Q3 sales fell to 90k.", SALES, False),
        ("Order 5521 was delivered on March 4.", ORDER, False),
        ("订单5521已于3月4日送达。", ORDER, False),
        ("Sales fell to 95k because Globex left.", SALES, False),
        # nothing checkable: a claim without values, or no claim at all
        ("The customer is unhappy.", SALES, False),
        ("Done.", SALES, False),
    ],
)
def test_check(conclusion: str, obs: dict[str, str], backed: bool) -> None:
    verdict = check(conclusion, obs, given="Why did EMEA sales drop in Q3?")
    assert verdict.backed is backed, verdict
    if backed:
        assert verdict.ids and set(verdict.ids) <= set(obs)
    else:
        assert verdict.ids == []


def test_ids_are_the_supporting_results_only() -> None:
    verdict = check("Q3 sales fell from 120000 to 95000.", SALES)
    assert verdict.ids == ["run1.s1.c0"]  # not the weather result beside it


def test_values_the_user_gave_prove_nothing() -> None:
    obs = {"t": json.dumps({"ok": True})}
    assert not check("Your order 5521 is on its way.", obs, given="Where is order 5521?").backed


def test_helpers() -> None:
    assert claims("销售额降到了9.5万，下降主要是因为失去了大客户。") == [
        "销售额降到了9.5万",
        "下降主要",
        "是因为失去了大客户",
    ]
    assert mentions("销售额为12万", "120000") and mentions("on 3月3日", "2026-03-03")
    assert not mentions("销售额为12万", "12000")
    for text in ["It is 3 degrees in Oslo today", "奥斯陆目前气温3度", "今天的汇率是7.1"]:
        assert perishable(text), text
    assert not perishable("Order 5521 was delivered on March 3")


async def test_store_keeps_an_unbacked_conclusion_out_of_the_block(
    store: AsyncMemoryStore,
) -> None:
    guess = "Sales fell to 95000. The drop is mainly due to losing a big customer."
    fact = "EMEA Q3 sales fell from 120000 to 95000."
    for text in (guess, fact):
        res = await store.write_back(
            Turn(user_message="Why did EMEA sales drop?", task_conclusion=text, observations=SALES),
            user_id="u1",
        )
        assert res[0].action == "stored"
    recs = {r.text: r for r in await store.list(user_id="u1")}
    assert provenance(recs[guess]) == "unverified"
    assert recs[guess].evidence == ["unchecked:run1.s1.c0", "unchecked:run1.s2.c0"]
    assert provenance(recs[fact]) == "evidence" and recs[fact].evidence == ["run1.s1.c0"]
    block = (await store.recall("why did EMEA sales drop", user_id="u1", threshold=-1e9)).block
    assert fact in block and guess not in block
