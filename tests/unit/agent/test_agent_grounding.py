"""A forced final answer is grounded in the tool results: echoes, bare arguments, unevaluated
expressions, claims of actions no tool performed and endless repeats are repaired from the
results; a good answer is kept as written."""

from __future__ import annotations

import json
from typing import Any

from loopstack.agent.core.state import AgentState, Observation
from loopstack.agent.run import grounding


def state(*results: tuple[str, dict[str, Any], Any, str]) -> AgentState:
    s = AgentState(goal="q")
    for i, (name, args, data, status) in enumerate(results):
        body = {"note": "untrusted", "status": status, "data": data, "error": None}
        s.observations.append(Observation(f"c{i}", name, args, status, json.dumps(body), "t", 1))  # type: ignore[arg-type]
    return s


WEATHER = ("get_weather", {"city": "Tokyo", "unit": "fahrenheit"},
           {"city": "Tokyo", "temperature": 18, "unit": "fahrenheit"}, "ok")  # fmt: skip
TIME = ("time__get_current_time", {"timezone": "Asia/Tokyo"},
        {"timezone": "Asia/Tokyo", "datetime": "2026-12-02T13:05:00+09:00"}, "ok")  # fmt: skip
CALC = ("calculate", {"expression": "2480 * 0.175"}, 434.0, "ok")
NAMES = frozenset({"get_weather", "time__get_current_time", "calculate", "write_file"})


def test_a_bare_argument_is_replaced_by_the_result() -> None:
    fixed = grounding.repair("fahrenheit", state(WEATHER), NAMES)
    assert "is a bare call argument" in fixed.problems
    assert "18" in fixed.answer and "fahrenheit" in fixed.answer


def test_an_echoed_call_is_replaced_by_the_result() -> None:
    fixed = grounding.repair("time__get_current_time({", state(TIME), NAMES)
    assert "echoes a tool call" in fixed.problems
    assert "2026-12-02 13:05:00+09:00" in fixed.answer and "(" not in fixed.answer


def test_an_unevaluated_expression_is_replaced() -> None:
    for text in ("{2480 * 0.175}", "math.ceil(125.0 + 19)", "2480 * 0.175"):
        fixed = grounding.repair(text, state(CALC), NAMES)
        assert "leaves an expression unevaluated" in fixed.problems, text
        assert fixed.answer == "From calculate: 434.0."


def test_a_claimed_action_that_never_ran_is_retracted() -> None:
    listed = ("list_files", {}, ["a.txt"], "ok")
    fixed = grounding.repair("I have created hello.txt with the text.", state(listed), NAMES)
    assert any(p.startswith("claims 'created'") for p in fixed.problems)
    assert fixed.answer.startswith("That was not done")
    wrote = ("write_file", {"path": "hello.txt"}, "wrote 17 characters", "ok")
    kept = grounding.repair("I have created hello.txt.", state(wrote), NAMES)
    assert not any(p.startswith("claims") for p in kept.problems)


def test_a_repeating_answer_stops_at_the_first_repeat() -> None:
    text = "It is 18 degrees in Tokyo. " * 6
    fixed = grounding.repair(text, state(WEATHER), NAMES)
    assert fixed.answer == "It is 18 degrees in Tokyo." and fixed.problems == ("repeats itself",)


def test_a_good_answer_is_kept_and_an_ungrounded_one_shows_the_results() -> None:
    good = "It is 18 degrees fahrenheit in Tokyo."
    assert grounding.repair(good, state(WEATHER), NAMES) == grounding.Repair(good, ())
    thin = grounding.repair("It is pleasant in Tokyo.", state(WEATHER), NAMES)
    assert thin.problems == ("carries no value from the tool results",)
    assert thin.answer.startswith("It is pleasant in Tokyo. (From get_weather:")
    failed = ("get_stock_price", {"symbol": "ACME"}, None, "error")
    plain = "The price service is unavailable."
    assert grounding.repair(plain, state(failed), NAMES).problems == ()
