"""The after-results bench's request and judge (no server): what each arm sends, and the
strict checker's verdicts on wrong answers."""

from __future__ import annotations

from loopstack.bench.agent.after_results import VLLM_DEFAULTS, body, judge, main


def test_each_arm_sends_the_round_trip_with_its_rule_and_sampling() -> None:
    off, rule, t1 = body("off", "m", 17), body("rule", "m", 17), body("rule@t1", "m", 17)
    assert off["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                   "content": "17°C and foggy"}  # fmt: skip
    assert off["loopstack"] == {"after_results": False} and rule["loopstack"]["after_results"]
    assert "temperature" not in rule  # the engine's defaults apply
    assert {k: t1[k] for k in VLLM_DEFAULTS} == VLLM_DEFAULTS


def test_the_judge_passes_only_text_stating_the_value() -> None:
    assert judge({"content": "It is 17°C and foggy in Paris."}, 17)[0]
    assert not judge({"content": None, "tool_calls": [{"id": "x"}]}, 17)[0]
    assert not judge({"content": "It is 170°C."}, 17)[0]
    assert not judge({"content": "It is not 17°C."}, 17)[0]
    assert not judge({"content": "Would you like the weather in Paris?"}, 17)[0]
    assert not judge({"content": "17°C, or maybe 21°C."}, 17)[0]


def test_an_unknown_arm_is_a_usage_error() -> None:
    assert main(["--arms", "off,sometimes"]) == 2
