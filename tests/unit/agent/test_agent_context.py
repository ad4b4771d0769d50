"""Compaction keeps pinned facts and tool-call pairs; token counting from usage."""

from __future__ import annotations

from typing import Any

from loopstack.agent.core.context import (
    TokenCounter,
    compaction_cut,
    extract_tool_facts,
    extract_user_facts,
    system_prompt,
)
from loopstack.agent.core.settings import AgentConfig, Limits
from loopstack.agent.core.state import AgentState, CompactionStep
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import Reply, ScriptedModel
from loopstack.agent.tools.registry import ToolRegistry


def price(item: str) -> dict[str, Any]:
    """Price of an item.

    Args:
        item: the item
    """
    return {"item": item, "price_eur": 1000 + len(item), "updated": "2026-03-14"}


def test_user_facts_and_tool_facts() -> None:
    facts = extract_user_facts("Hi there. My budget is 500 EUR. Never book before March 3. Thanks!")
    assert facts == ["My budget is 500 EUR.", "Never book before March 3."]
    tf = extract_tool_facts("price", '{"status": "ok", "data": {"price_eur": 12, "x": "a"}}')
    assert tf == [("price.price_eur", "12")]


def test_cut_never_splits_a_tool_call_from_its_result() -> None:
    def turn(i: int) -> list[dict[str, Any]]:
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "{}"},
        ]

    msgs = [{"role": "user", "content": "go"}, *turn(1), *turn(2), *turn(3)]
    cut = compaction_cut(msgs, keep_turns=2)
    assert msgs[cut]["role"] == "assistant" and msgs[cut]["tool_calls"][0]["id"] == "c2"
    assert compaction_cut(msgs, keep_turns=10) == 0


async def test_compaction_keeps_pinned_facts_and_pairs() -> None:
    items = iter(["anvil", "bucket", "candle", "drill", "easel", "funnel", "gavel"])
    model = ScriptedModel(
        [lambda b: Reply(tool_calls=(("price", {"item": next(items)}),), prompt_tokens=400)],
        summary="looked up prices",
    )
    limits = Limits(context_tokens=450, keep_turns=2, max_steps=5)
    agent = Agent(model.client(), "m", ToolRegistry([price]), AgentConfig(limits))
    res = await agent.run("Price list please. My budget is 5000 EUR.")
    assert any(isinstance(s, CompactionStep) for s in res.history)
    last = model.chat_requests[-1]["messages"]
    system = last[0]["content"]
    assert "My budget is 5000 EUR." in system  # user constraint pinned
    assert "price(item=anvil).price_eur: 1005" in system  # fact of a compacted tool result (anvil)
    assert "looked up prices" in system  # the summary
    ids = set()
    for m in last:
        for c in m.get("tool_calls") or []:
            ids.add(c["id"])
        if m["role"] == "tool":
            assert m["tool_call_id"] in ids  # every result follows its call
    assert "anvil" not in str(last[1:])  # the compacted turn left the history


def test_token_count_uses_last_usage_plus_new_messages() -> None:
    state = AgentState(goal="g")
    counter = TokenCounter()
    state.messages = [{"role": "user", "content": "g"}]
    assert counter.context_tokens(state, 0) >= counter.count(system_prompt(state))
    state.usage.add(1000, 10)
    state.messages.append({"role": "tool", "tool_call_id": "x", "content": "y" * 350})
    assert counter.context_tokens(state, 1) == 1000 + counter.count("y" * 350) + 4


def test_the_final_answer_prompt_points_at_remembered_facts() -> None:
    from loopstack.agent.run.answer import _prompt
    from loopstack.memory import BLOCK_FOOTER, BLOCK_HEADER

    state = AgentState(goal="What is my favourite city?")
    plain = _prompt(state, "no_progress")[1]["content"]
    assert "values from the tool results" in plain and "Remembered" not in plain
    state.memory_block = (
        f"{BLOCK_HEADER}\n- [fact | 2026-12 | user said] my favourite city is Porto\n{BLOCK_FOOTER}"
    )
    prompt = _prompt(state, "no_progress")[1]["content"]
    # the entries only (not the block's guidance), and the instruction names them as a source:
    # told to use "the values from the tool results", the model answered "no city was mentioned"
    assert "my favourite city is Porto" in prompt and BLOCK_HEADER not in prompt
    assert "values from the remembered facts and the tool results" in prompt
