"""``usage.prompt_tokens_details.cached_tokens``: passed through from the engine (vLLM with
``--enable-prompt-tokens-details``) on tool-call replies, absent when the engine omits it."""

from __future__ import annotations

from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import PARIS, WEATHER, call, post_chat


async def test_cached_tokens_pass_through_on_tool_calls(harness: Harness) -> None:
    h = harness
    h.engine.cached_tokens = 96
    h.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required")
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}


async def test_no_details_when_the_engine_gives_none(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    resp = await post_chat(h, tools=[WEATHER], tool_choice="required")
    assert "prompt_tokens_details" not in resp.json()["usage"]


def test_the_engine_is_asked_for_prompt_token_details() -> None:
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.engine.hardware import Hardware, vllm_launch

    for hw in (Hardware("cpu", 0, 2, 24.0, frozenset()), Hardware("cuda", 1, 8, 64.0)):
        assert "--enable-prompt-tokens-details" in vllm_launch(ServerSettings(), hw, "m", "m").argv
