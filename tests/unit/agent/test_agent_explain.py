"""The trace explains memory: the start line holds the input, the block as injected and
recall's kept/dropped choices with scores and reasons; `loopstack agent explain` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopstack.agent import cli
from loopstack.agent.observe.explain import reason_code, render
from loopstack.agent.observe.trace import load_trace
from loopstack.agent.run.longterm import StoreMemory
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import ScriptedModel, text
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings


@pytest.mark.parametrize(
    ("kept", "detail", "code"),
    [
        (True, "packed", "packed"),
        (False, "trust 0.17 below floor 0.35", "low_trust"),
        (False, "below threshold 0.20", "below_threshold"),
        (False, "does not fit budget (40 tokens, 30 used)", "over_budget"),
        (False, "over max_items 8", "over_max_items"),
        (False, "above threshold", "other"),  # dropped, but memory's reason says kept
        (False, "some new reason", "other"),
    ],
)
def test_reason_codes(kept: bool, detail: str, code: str) -> None:
    assert reason_code(kept, detail) == code


async def test_the_start_line_explains_what_was_kept_and_dropped(tmp_path: Path) -> None:
    settings = MemorySettings(threshold=0.2, persist_every=50)
    st = await AsyncMemoryStore(
        tmp_path / "m.db", embedder=HashingEmbedder(), settings=settings
    ).open()
    try:
        await st.add("The user's locker code is 4417.", user_id="ana")
        await st.add(
            "The locker code was probably changed to 9999 by facilities.",
            user_id="ana",
            source="inferred",
            confidence=0.3,
        )
        await st.add(
            "Locker rooms: the locker code policy of the gym says codes have four digits "
            "and the code of every locker is printed on the locker code card at the desk.",
            user_id="ana",
        )
        await st.add("The user likes green tea in the morning.", user_id="ana")
        link = StoreMemory(st, user_id="ana", budget_tokens=90)
        model = ScriptedModel([text("4417")])
        res = await Agent(model.client(), "m", memory=link).run("What is my locker code?")
    finally:
        await st.close()
    lines = load_trace(res.trace_path)
    start = lines[0]
    assert start["type"] == "start" and start["input"] == "What is my locker code?"
    system = model.requests[0]["messages"][0]["content"]
    assert start["memory_block"] and start["memory_block"] in system  # as injected
    recall = start["recall"]
    kept = {e["text"]: e for e in recall["kept"]}
    dropped = {e["text"]: e for e in recall["dropped"]}
    assert "The user's locker code is 4417." in kept
    assert kept["The user's locker code is 4417."]["reason"] == "packed"
    guess = dropped["The locker code was probably changed to 9999 by facilities."]
    assert guess["reason"] == "low_trust" and guess["trust"] < 0.35
    assert "9999" not in start["memory_block"]
    reasons = {e["reason"] for e in recall["dropped"]}
    assert "over_budget" in reasons  # the long policy text did not fit 90 tokens (56 are the frame)
    for e in recall["kept"] + recall["dropped"]:
        assert isinstance(e["score"], float) and e["detail"]
    shown = render(lines)
    assert "input: What is my locker code?" in shown
    assert "low_trust" in shown and "over_budget" in shown and "| <memory>" in shown

    res_cli = CliRunner().invoke(cli.app, ["explain", res.trace_path])
    assert res_cli.exit_code == 0 and "kept:" in res_cli.stdout and "dropped:" in res_cli.stdout
    as_json = CliRunner().invoke(cli.app, ["explain", res.run_id[:12], "--json"])
    assert json.loads(as_json.stdout)[0]["recall"]["kept"]


async def test_without_memory_the_start_line_still_has_the_input() -> None:
    model = ScriptedModel([text("hi")])
    res = await Agent(model.client(), "m").run("hello there")
    lines = load_trace(res.trace_path)
    assert lines[0]["type"] == "start" and lines[0]["memory"] == "off"
    assert lines[0]["recall"] is None and "memory block: (empty)" in render(lines)
    assert CliRunner().invoke(cli.app, ["explain", "no-such-run"]).exit_code == 1
