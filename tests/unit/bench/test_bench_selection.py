"""The tool-selection benchmark's own logic (loopstack.bench.agent.selection): items, arms,
scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopstack.bench.agent.selection import (
    ARMS,
    EVERYDAY_ITEMS,
    Row,
    _same,
    abstention_items,
    arm_request,
    expected_values,
    golden_tools,
    known_arm,
    selection_items,
    summarize,
    time_tools,
)

PARAMS = {
    "properties": {
        "spaceName": {"type": "string"},
        "name": {"type": "string"},
        "maxResults": {"type": "integer"},
        "dryRun": {"type": "boolean"},
        "tags": {"type": "array"},
    }
}


def test_expected_values_read_the_templated_request() -> None:
    prompt = 'Space name "checkout-eu", name "webapp-dev", max results 60 and dry run false.'
    got = expected_values(prompt, PARAMS)
    # "name" inside "space name" is not the name parameter's value
    assert got == {"spaceName": "checkout-eu", "name": "webapp-dev", "maxResults": 60,
                   "dryRun": False}  # fmt: skip
    assert expected_values("Nothing stated here.", PARAMS) == {}
    assert expected_values('Space name "a".', PARAMS) == {"spaceName": "a"}


def test_same_is_strict_about_types() -> None:
    assert _same(60, 60.0) and _same("a", "a") and _same(False, False)
    assert not _same("60", 60) and not _same(1, True) and not _same("A", "a")


def test_items_hold_the_right_tool_once_among_n() -> None:
    for size in (5, 10, 30):
        items = selection_items(4, size, 7)
        assert len(items) == 12 + 4  # the golden items and 4 from the corpus
        positions = set()
        for it in items:
            names = [t["function"]["name"] for t in it.tools]
            assert len(names) == size and len(set(names)) == size
            assert names.count(it.right) == 1
            positions.add(names.index(it.right))
        assert len(positions) > 1  # not always the same place
    assert selection_items(4, 10, 7) == selection_items(4, 10, 7)  # seeded


def test_the_chinese_items_ask_for_the_same_tools_in_chinese() -> None:
    from loopstack.serving.selection.rank import floor_applies

    for size in (5, 10, 30):
        items = selection_items(60, size, 7, "zh")
        assert len(items) == 24  # no corpus items: their requests are English templates
        for it in items:
            names = [t["function"]["name"] for t in it.tools]
            assert len(names) == size == len(set(names)) and names.count(it.right) == 1
            assert not floor_applies(it.prompt), it.prompt  # written in Chinese
            right = next(t for t in it.tools if t["function"]["name"] == it.right)
            assert set(it.expected) <= set(right["function"]["parameters"]["properties"])
    rights = {it.right for it in selection_items(0, 10, 7, "zh")}
    assert {"time__get_current_time", "time__convert_time", "delete_file"} <= rights
    english = abstention_items()
    chinese = abstention_items("zh")
    assert [i.tools for i in chinese] == [i.tools for i in english]  # the same tools offered
    assert all(not floor_applies(i.prompt) for i in chinese)
    assert all(floor_applies(i.prompt) for i in english)


def test_arms_reorder_or_ask_the_server() -> None:
    item = selection_items(1, 5, 7)[0]
    given, _ = arm_request(item, "given", 7, None)
    rev, _ = arm_request(item, "reversed", 7, None)
    shuf, _ = arm_request(item, "shuffled", 7, None)
    assert rev == given[::-1] and sorted(map(str, shuf)) == sorted(map(str, given))
    off = {"tool_rank": None, "abstain": False, "decide": False}  # every field stated
    assert arm_request(item, "given", 7, None)[1] == off
    assert arm_request(item, "top3", 7, None)[1] == {**off, "tool_rank": {"top_k": 3}}
    _, best = arm_request(item, "top5+floor+abstain", 7, 0.3)
    assert best == {**off, "tool_rank": {"top_k": 5, "min_score": 0.3}, "abstain": True}
    _, no_floor = arm_request(item, "top5+abstain", 7, 0.3)  # says no floor: gets none
    assert no_floor == {**off, "tool_rank": {"top_k": 5}, "abstain": True}
    _, low = arm_request(item, "top5+floor0.15+abstain", 7, 0.3)  # its own floor
    assert low == {**off, "tool_rank": {"top_k": 5, "min_score": 0.15}, "abstain": True}
    _, composed = arm_request(item, "ranked+floor+decide", 7, 0.25)
    assert composed == {**off, "tool_rank": {"min_score": 0.25}, "decide": True}
    assert arm_request(item, "given+abstain", 7, None)[1] == {**off, "abstain": True}
    assert arm_request(item, "defaults", 7, None) == (given, {})  # nothing said
    assert known_arm("top5+decide") and not known_arm("top5+loud") and not known_arm("best")
    assert not known_arm("top5+floorx") and not known_arm("top5+floor-1")
    assert set(ARMS) >= {"given", "reversed", "shuffled", "ranked", "top3", "top5"}
    assert len(abstention_items()) == 40 and all(i.right is None for i in abstention_items())


def test_summary_counts_right_wrong_none_and_false_calls() -> None:
    rows = [
        Row("a@5", 5, "given", "t", 0, 5, ["t"], True, True, 100, 1.0),
        Row("b@5", 5, "given", "t", 4, 5, ["u"], False, None, 100, 2.0),
        Row("c@5", 5, "given", "t", 2, 5, [], False, None, 100, 3.0),
        Row("d@5", 5, "given", "t", 2, 5, error="boom"),
        Row("x", 3, "given", None, -1, 3, ["u"]),
        Row("y", 3, "given", None, -1, 3, []),
    ]
    s = summarize(rows)
    g = s["selection"]["5/given"]
    assert (g["n"], g["accuracy"], g["args_accuracy"], g["no_call"], g["wrong_tool"]) == (
        3, 0.333, 0.333, 1, 1)  # fmt: skip
    assert g["errors"] == 1
    assert g["calls_kept"] == 0.667  # 2 of the 3 answered requests needing a tool got a call
    assert s["abstention"]["given"]["false_call_rate"] == 0.5
    assert s["position"]["5/given"] == {"first": "1/1", "last": "0/1", "middle": "0/1"}


def test_the_abstention_set_is_one_whatever_the_number_of_tools_offered() -> None:
    # its requests offer 1 to 5 tools: one figure over all of them, not the last size's
    rows = [
        Row(f"x{i}", 1 + i % 3, "given", None, -1, 1 + i % 3, ["u"] if i < 4 else [])
        for i in range(10)
    ]
    s = summarize(rows)
    assert s["abstention"] == {
        "given": {"n": 10, "false_calls": 4, "false_call_rate": 0.4, "errors": 0}
    }


def test_the_everyday_items_offer_the_agents_own_tools() -> None:
    items = selection_items(60, 10, 7, everyday=EVERYDAY_ITEMS)
    assert len(items) == 24 and all(it.id.startswith("everyday-") for it in items)
    own = {*golden_tools(), *time_tools()}
    for it in items:
        names = [t["function"]["name"] for t in it.tools]
        assert len(names) == 10 == len(set(names)) and names.count(it.right) == 1
        assert set(names) <= own  # no corpus tool: the look-alikes are the agent's own
    assert selection_items(0, 10, 7, everyday=EVERYDAY_ITEMS) == items  # seeded, no corpus items
    whole = selection_items(0, 18, 7, everyday=EVERYDAY_ITEMS)
    assert all(len(it.tools) == 18 for it in whole)  # every golden and time tool


def test_everyday_requests_of_ones_own_from_a_file(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text(
        json.dumps(
            [{"id": "m-0", "prompt": "Rain in Oslo?", "tool": "get_weather", "expected": {}}]
        )
    )
    [item] = selection_items(60, 10, 7, everyday=mine)
    assert (item.id, item.prompt, item.right, len(item.tools)) == (
        "m-0@10",
        "Rain in Oslo?",
        "get_weather",
        10,
    )
    mine.write_text(
        json.dumps([{"id": "m-1", "prompt": "x", "tool": "book_flight", "expected": {}}])
    )
    with pytest.raises(ValueError, match="book_flight"):  # not one of the agent's tools
        selection_items(0, 10, 7, everyday=mine)
