"""Selection users get without asking (loopstack.serving.selection.defaults,
loopstack.serving.constraint.decision): the operator's settings, the per-model shipped defaults,
per-request overrides through ``loopstack``, and the decision before the call (the guidance grammar
admits it; the response hides it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import llguidance
import pytest

from loopstack.memory.embedding import HashingEmbedder
from loopstack.serving.config import ServerSettings
from loopstack.serving.constraint.backend import TurnSpec
from loopstack.serving.constraint.decision import DECIDE_RULE, hide_decision
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.constraint.guidance import _ByteTokenizer, lark_grammar
from loopstack.serving.constraint.turn import ContentDelta, Done, Event, Retry
from loopstack.serving.protocol import ChatCompletionRequest
from loopstack.serving.selection import defaults as sd
from loopstack.serving.selection.defaults import SelectionDefaults, selection_defaults
from loopstack.serving.selection.rank import ToolRanker
from loopstack.serving.selection.requests import ABSTAIN_RULE, RESULTS_RULE
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import ADD, WEATHER, call, post_chat

ON = SelectionDefaults(rank=True, top_k=5, min_score=0.3, abstain=True, decide=True)


def _req(**loopstack: Any) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body["tools"] = [WEATHER, ADD]
    if loopstack:
        body["loopstack"] = loopstack
    return ChatCompletionRequest.model_validate(body)


# --- the operator's settings and the shipped defaults ----------------------------------------


def test_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "true", "TOP_K": "5", "MIN_SCORE": "0.25", "ABSTAIN": "1",
                       "DECIDE": "false"}.items():  # fmt: skip
        monkeypatch.setenv(f"LOOPSTACK_TOOL_{key}", value)
    s = ServerSettings()
    got = selection_defaults(
        "any-model", rank=s.tool_rank, top_k=s.tool_top_k, min_score=s.tool_min_score,
        abstain=s.tool_abstain, decide=s.tool_decide,
    )  # fmt: skip
    assert got == SelectionDefaults(rank=True, top_k=5, min_score=0.25, abstain=True)
    monkeypatch.setenv("LOOPSTACK_TOOL_MIN_SCORE", "off")
    assert ServerSettings().tool_min_score == "off"
    monkeypatch.setenv("LOOPSTACK_TOOL_MIN_SCORE", "loud")
    with pytest.raises(ValueError):
        ServerSettings()


def test_unset_settings_take_the_models_shipped_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sd.SHIPPED, "m-1", ON)
    assert selection_defaults("m-1") == ON
    assert selection_defaults("another") == SelectionDefaults()  # nothing shipped: all off
    # each setting that is set wins over the shipped value; 0 / "off" say "none"
    mine = selection_defaults("m-1", top_k=0, min_score="off", decide=False)
    assert mine == SelectionDefaults(rank=True, abstain=True)
    assert selection_defaults("m-1", rank=False).rank is False
    assert selection_defaults("m-1", min_score=0.1).min_score == 0.1


# --- per-request overrides --------------------------------------------------------------------


def test_a_request_that_says_nothing_gets_the_defaults() -> None:
    req, applied = ON.apply(_req())
    assert applied == ["tool_rank", "abstain", "decide"]
    rank = req.loopstack.tool_rank
    assert rank is not None and (rank.top_k, rank.min_score, rank.query) == (5, 0.3, None)
    assert req.loopstack.abstain and req.loopstack.decide
    off, applied = SelectionDefaults().apply(_req())  # the defaults off: nothing changes
    assert applied == [] and off.loopstack.tool_rank is None and not off.loopstack.abstain


def test_each_field_a_request_states_wins() -> None:
    req, applied = ON.apply(_req(tool_rank={"top_k": 2}, abstain=False))
    assert applied == ["decide"]
    rank = req.loopstack.tool_rank
    assert rank is not None and (rank.top_k, rank.min_score) == (2, None)  # exactly its own
    assert req.loopstack.abstain is False and req.loopstack.decide is True
    for off in (None, False):  # `null` or `false`: no ranking
        req, applied = ON.apply(_req(tool_rank=off, decide=False))
        assert req.loopstack.tool_rank is None and applied == ["abstain"]
    bare = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert ON.apply(bare) == (bare, [])  # no tools: nothing to select


@pytest.fixture
def guidance(make_harness: Callable[..., Harness]) -> Harness:
    backend = make_backend("guidance", None, mode="thread")
    return make_harness(backend=backend, ranker=ToolRanker(HashingEmbedder()))


async def test_the_server_defaults_reach_the_turn_and_the_response_says_so(
    guidance: Harness,
) -> None:
    h = guidance
    h.chat.selection = SelectionDefaults(rank=True, top_k=1, abstain=True)
    h.engine.constrained = ["It is sunny."]
    resp = await post_chat(h, tools=[ADD, WEATHER])
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-loopstack-selection"] == "server defaults: tool_rank,abstain"
    assert resp.headers["x-loopstack-tools-offered"] == "get_weather"  # ranked and cut to 1
    prompt = h.engine.requests[0][1]["prompt"]
    assert ABSTAIN_RULE in prompt
    # the same request opting out of both: every tool, no rule, no header
    h.engine.requests.clear()
    resp = await post_chat(h, tools=[ADD, WEATHER], loopstack={"tool_rank": None,
                                                             "abstain": False})  # fmt: skip
    assert resp.status_code == 200, resp.text
    assert "x-loopstack-selection" not in resp.headers
    assert "x-loopstack-tools-offered" not in resp.headers
    assert ABSTAIN_RULE not in h.engine.requests[0][1]["prompt"]


async def test_the_results_rule_is_said_only_after_a_tool_result(guidance: Harness) -> None:
    """``after_results``: the 1.5B, given the weather it asked for, called the same tool again
    or answered beside the point in most samples; the rule is said after the conversation (a
    closing system message) of a turn that ends with tool results, never before, and the
    prompt up to the results is the one the turn before sent: the engine's prefix cache
    keeps it (in the first system message, Claude Code's ~17k tokens of tools came after it
    and were prefilled again every tool-result turn)."""
    h = guidance
    h.chat.selection = SelectionDefaults(after_results=True)
    h.engine.constrained = ["It is 19°C and foggy."]
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    resp = await post_chat(h, tools=[WEATHER], messages=asked)
    assert resp.status_code == 200, resp.text
    assert "x-loopstack-selection" not in resp.headers  # nothing applied before a result
    assert RESULTS_RULE not in h.engine.requests[-1][1]["prompt"]
    answered = [*asked,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "19°C and foggy"}]  # fmt: skip
    resp = await post_chat(h, tools=[WEATHER], messages=answered)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-loopstack-selection"] == "server defaults: after_results"
    after = h.engine.requests[-1][1]["prompt"]
    assert RESULTS_RULE in after
    assert after.index(RESULTS_RULE) > after.index("19°C and foggy")  # after the result
    before = h.engine.requests[0][1]["prompt"]
    tools_end = before.index("</tools>")
    assert after[:tools_end] == before[:tools_end]  # the system message and tools unchanged
    resp = await post_chat(h, tools=[WEATHER], messages=answered,
                           loopstack={"after_results": False})  # fmt: skip
    assert RESULTS_RULE not in h.engine.requests[-1][1]["prompt"]


# --- the decision before the call --------------------------------------------------------------

TOK = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


def _admits(grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(TOK, llguidance.grammar_from("lark", grammar))
    ok = all(matcher.consume_token(b) for b in text.encode())
    return ok and not matcher.is_error()


def _spec(decide: bool) -> TurnSpec:
    tools = {
        "get_weather": WEATHER["function"]["parameters"],
        "add": ADD["function"]["parameters"],
    }
    return TurnSpec("auto", tools, parallel=True, decide=decide)


def test_the_auto_grammar_admits_a_short_decision_then_its_call_or_text() -> None:
    g = lark_grammar(_spec(True))
    weather = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert _admits(g, "Decision: get_weather\n<tool_call>\n" + weather)
    assert _admits(g, "Decision: get_weather Paris\n<tool_call>" + weather + "\n</tool_call>")
    assert _admits(g, "Decision: none\nHello there.")
    assert _admits(g, "Decision: none plain question\nAn answer.")
    assert not _admits(g, "Decision: search\n")  # a tool that is not offered
    assert not _admits(g, "Hello, no decision.")  # the decision comes first
    assert not _admits(g, "Decision: add 1 2\n<tool_call>\n" + weather)  # its own call only
    assert not _admits(g, "Decision: none\n<tool_call>\n" + weather)  # none: text only
    # capped: a decision of more than DECISION_MAX_TOKENS tokens (bytes, here) is refused
    assert not _admits(g, "Decision: none " + "very long reasoning " * 2 + "\nx")
    plain = lark_grammar(_spec(False))  # off: the turn is what it was
    assert "Decision" not in plain and _admits(plain, "Hello, no decision.")


async def _events(*items: Event) -> AsyncIterator[Event]:
    for ev in items:
        yield ev


async def test_the_decision_line_is_hidden_even_split_over_deltas() -> None:
    got = [ev async for ev in hide_decision(_events(
        ContentDelta("Decis"), ContentDelta("ion: none sma"), ContentDelta("ll\nThe ans"),
        ContentDelta("wer."), Retry(0, ["bad"]), ContentDelta("Decision: none\nAgain."),
        Done("stop", 9)))]  # fmt: skip
    texts = [ev.text for ev in got if isinstance(ev, ContentDelta)]
    assert texts == ["The ans", "wer.", "Again."]
    assert isinstance(got[-1], Done) and any(isinstance(ev, Retry) for ev in got)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_decided_turn_answers_as_an_ordinary_response(
    guidance: Harness, stream: bool
) -> None:
    h = guidance
    weather = call("get_weather", {"city": "Paris"})
    h.engine.constrained = ["Decision: get_weather Paris\n<tool_call>\n" + weather]
    body: dict[str, Any] = {"tools": [WEATHER, ADD], "loopstack": {"decide": True}}
    resp = await post_chat(h, stream=stream, **body)
    assert resp.status_code == 200, resp.text
    sent = h.engine.requests[0][1]
    assert '"Decision: "' in sent["structured_outputs"]["grammar"]
    assert DECIDE_RULE in sent["prompt"]
    if stream:
        chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c["choices"])  # fmt: skip
        names = [tc["function"].get("name") for c in chunks if c["choices"]
                 for tc in c["choices"][0]["delta"].get("tool_calls") or []]  # fmt: skip
        assert "Decision" not in text and "get_weather" in names
    else:
        msg = resp.json()["choices"][0]["message"]
        assert not msg["content"] and msg["tool_calls"][0]["function"]["name"] == "get_weather"
        assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    # a text answer after `none`: the line is gone, the answer stays
    h.engine.requests.clear()
    h.engine.constrained = ["Decision: none\nHello, how can I help?"]
    resp = await post_chat(h, **body)
    assert resp.json()["choices"][0]["message"]["content"] == "Hello, how can I help?"
    # off (the default): no decision in the grammar or the prompt
    h.engine.requests.clear()
    h.engine.constrained = ["Hi."]
    await post_chat(h, tools=[WEATHER, ADD])
    sent = h.engine.requests[0][1]
    assert "Decision" not in sent["structured_outputs"]["grammar"]
    assert DECIDE_RULE not in sent["prompt"]


def test_the_shipped_defaults_are_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 0.5B ships its measured set (ranking, top 5, floor 0.15, the rule: 2026-12-06); the
    # 1.5B the abstention rule alone (its ranking set dropped calls)
    small = selection_defaults("qwen2.5-coder-0.5b-instruct")
    assert small == sd.MEASURED_0_5B
    assert small == SelectionDefaults(rank=True, top_k=5, min_score=0.15, abstain=True)
    assert selection_defaults("qwen2.5-coder-0.5b-instruct", rank=False).rank is False
    assert selection_defaults("qwen2.5-coder-0.5b-instruct", min_score="off").min_score is None
    big = SelectionDefaults(abstain=True, after_results=True)  # the results rule: 2026-12-07
    assert selection_defaults("qwen2.5-coder-1.5b-instruct") == big
    off = selection_defaults("qwen2.5-coder-1.5b-instruct", abstain=False, after_results=False)
    assert off == SelectionDefaults()
    assert selection_defaults("Qwen/Qwen3-8B") == SelectionDefaults()  # not measured: off
    monkeypatch.setitem(sd.SHIPPED, "qwen2.5-coder-0.5b-instruct", SelectionDefaults())
    assert selection_defaults("qwen2.5-coder-0.5b-instruct", abstain=True).rank is False


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "add"}}, "none"],
    ids=["required", "named", "none"],
)
def test_only_auto_requests_get_the_defaults(choice: Any) -> None:
    """A required or named request keeps every tool it offers: the ranking's floor once
    dropped the one tool a named choice pointed at (a 200 where a 400 was due)."""
    body = {**_req().model_dump(exclude_none=True), "tool_choice": choice}
    req = ChatCompletionRequest.model_validate(body)  # parsed, as a request's body is
    assert ON.apply(req) == (req, [])
    assert ON.apply(_req())[1] == ["tool_rank", "abstain", "decide"]


async def test_the_three_front_ends_get_the_same_selection_defaults(guidance: Harness) -> None:
    """A request is served by what it says, not by the API it came through: chat, Messages
    and Responses get the same server defaults (they differed: the same conversation answered
    differently through the three)."""
    h = guidance
    h.chat.selection = SelectionDefaults(abstain=True)
    h.engine.constrained = ["It is sunny."] * 3
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    hi = [{"role": "user", "content": "hi"}]
    chat = {"model": "test-model", "max_tokens": 32, "messages": hi,
            "tools": [{"type": "function", "function": {"name": n, "parameters": schema}}
                      for n in ("Read", "Bash")]}  # fmt: skip
    msg = {"model": "test-model", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"name": "Read", "input_schema": schema},
                     {"name": "Bash", "input_schema": schema}]}  # fmt: skip
    rsp = {"model": "test-model", "max_output_tokens": 32, "input": "hi",
           "tools": [{"type": "function", "name": n, "parameters": schema}
                     for n in ("Read", "Bash")]}  # fmt: skip
    prompts = []
    for path, body in [
        ("/v1/chat/completions", chat),
        ("/v1/messages", msg),
        ("/v1/responses", rsp),
    ]:
        resp = await h.client.post(path, json=body)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-loopstack-selection"] == "server defaults: abstain", path
        prompts.append(h.engine.requests[-1][1]["prompt"])
    assert ABSTAIN_RULE in prompts[0] and prompts[0] == prompts[1] == prompts[2]


def test_a_harness_toolbox_is_not_ranked_whatever_its_api() -> None:
    """Ranking was measured at 5 and 10 tools; Claude Code's 24 (its toolbox for the whole
    task) lost the Read it called next. Past `RANK_MAX_TOOLS` the other defaults still apply."""
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
             for i in range(sd.RANK_MAX_TOOLS + 1)]  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    many = ChatCompletionRequest.model_validate(body)
    assert ON.apply(many)[1] == ["abstain", "decide"]
    few = ChatCompletionRequest.model_validate({**body, "tools": tools[: sd.RANK_MAX_TOOLS]})
    assert ON.apply(few)[1] == ["tool_rank", "abstain", "decide"]
