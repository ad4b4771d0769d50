"""The loop against a scripted model behind the real openai client."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from loopstack.agent.core.settings import AgentConfig, Limits
from loopstack.agent.core.state import FinalStep, LimitStep, ModelStep, ToolStep
from loopstack.agent.observe.trace import load_trace
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import Reply, ScriptedModel, call, calls, text
from loopstack.agent.tools.registry import ToolRegistry


def weather(city: str) -> dict[str, Any]:
    """Weather for a city.

    Args:
        city: the city
    """
    return {"city": city, "temperature": 18}


def make(model: ScriptedModel, *fns: Any, **kw: Any) -> Agent:
    return Agent(
        model.client(), "scripted-model", ToolRegistry(fns or [weather]), AgentConfig(**kw)
    )


async def test_repeated_call_forces_final_answer_without_tools() -> None:
    model = ScriptedModel([call("weather", city="Paris")], answer="18 degrees in Paris")
    agent = make(model)
    steps = [s async for s in agent.steps("Weather in Paris?")]
    kinds = [type(s).__name__ for s in steps]
    # the first repeat is not run but answered with a hint; the second forces the answer
    assert kinds == ["ModelStep", "ToolStep", "ModelStep", "ToolStep", "ModelStep", "FinalStep"]
    hint = steps[3]
    assert isinstance(hint, ToolStep) and hint.error_type == "repeated_call"
    hinted = model.chat_requests[2]["messages"][-1]
    assert hinted["role"] == "tool" and "reply with the final answer" in hinted["content"]
    final = steps[-1]
    assert isinstance(final, FinalStep)
    assert (final.status, final.reason, final.answer, final.forced) == (
        "done",
        "repeated_call",
        "18 degrees in Paris",
        True,
    )
    # the tool ran once; the final request had no tools and a response_format schema
    last = model.requests[-1]
    assert "tools" not in last and last["response_format"]["type"] == "json_schema"
    assert "18" in last["messages"][-1]["content"]


async def test_a_repeated_failing_call_is_told_to_fix_its_arguments() -> None:
    def lookup(city: str) -> str:
        """Weather by exact city name.

        Args:
            city: the city
        """
        if city != "Lisbon":
            raise ValueError(f"no weather for {city!r}; known: Lisbon")
        return "sunny"

    model = ScriptedModel(
        [
            call("lookup", city="Lisboa"),
            call("lookup", city="Lisboa"),
            call("lookup", city="Lisbon"),
        ],
        answer="sunny in Lisbon",
    )
    res = await make(model, lookup).run("Weather in Lisbon?")
    hinted = model.chat_requests[2]["messages"][-1]
    assert hinted["role"] == "tool" and "corrected arguments" in hinted["content"]
    assert [c["status"] for c in res.tool_calls] == ["error", "ok"]
    assert res.answer == "sunny in Lisbon"


async def test_tool_call_ids_pair_with_tool_messages() -> None:
    model = ScriptedModel(
        [calls(("weather", {"city": "A"}), ("weather", {"city": "B"})), text("done")]
    )
    await make(model).run("two cities")
    second = model.chat_requests[1]["messages"]
    asst = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")]
    tools = [m for m in second if m["role"] == "tool"]
    assert len(asst) == 1 and len(tools) == 2
    assert [c["id"] for c in asst[0]["tool_calls"]] == [m["tool_call_id"] for m in tools]
    body = json.loads(tools[0]["content"])
    assert body["status"] == "ok" and body["data"]["city"] == "A" and body["error"] is None
    assert "untrusted" in body["note"]


async def test_independent_calls_run_concurrently() -> None:
    async def slow(n: int) -> int:
        """Slow.

        Args:
            n: a number
        """
        await asyncio.sleep(0.3)
        return n

    model = ScriptedModel(
        [calls(("slow", {"n": 1}), ("slow", {"n": 2}), ("slow", {"n": 3})), text("ok")]
    )
    agent = make(model, slow)
    t0 = time.perf_counter()
    result = await agent.run("three")
    assert time.perf_counter() - t0 < 0.8
    assert [c["status"] for c in result.tool_calls] == ["ok", "ok", "ok"]


async def test_text_reply_triggers_forced_answer_or_is_accepted() -> None:
    model = ScriptedModel([text("it is sunny")], answer="forced")
    res = await make(model, tool_nudge=False).run("q")
    assert (res.status, res.reason, res.answer) == ("done", "answer", "forced")
    model2 = ScriptedModel([text("it is sunny")])
    res2 = await make(model2, text_answers="accept", tool_nudge=False).run("q")
    assert res2.answer == "it is sunny" and len(model2.requests) == 1


async def test_text_before_any_tool_call_is_retried_with_a_call_required() -> None:
    model = ScriptedModel(
        [text("probably sunny"), call("weather", city="Paris")], answer="18 in Paris"
    )
    res = await make(model, limits=Limits(repeat_nudges=0)).run("Weather in Paris?")
    assert [r["tool_choice"] for r in model.chat_requests] == ["auto", "required", "auto"]
    assert res.tool_calls == [{"name": "weather", "arguments": {"city": "Paris"}, "status": "ok"}]
    assert res.answer == "18 in Paris"
    assert "probably sunny" not in str(model.chat_requests[1]["messages"])  # guess dropped
    # only once: a second text reply is the answer
    model2 = ScriptedModel([text("hello")], answer="Hello!")
    res2 = await make(model2).run("hi")
    assert [r["tool_choice"] for r in model2.chat_requests] == ["auto", "required"]
    assert res2.answer == "Hello!" and res2.tool_calls == []


async def test_max_steps_ends_with_status_and_best_effort_answer() -> None:
    counter = iter(range(1000))
    model = ScriptedModel(
        [lambda body: call("weather", city=f"c{next(counter)}")], answer="partial"
    )
    res = await make(model, limits=Limits(max_steps=3)).run("loop")
    assert (res.status, res.reason) == ("max_steps", "max_steps")
    # "partial" names no value the tools returned: the results are shown with it
    assert res.answer.startswith("partial (From weather:") and "temperature 18" in res.answer
    assert res.steps == 3 and len(res.tool_calls) == 3
    assert any(isinstance(s, LimitStep) for s in res.history)


async def test_max_tool_calls() -> None:
    counter = iter(range(1000))
    model = ScriptedModel(
        [lambda b: calls(*[("weather", {"city": f"c{next(counter)}"}) for _ in range(3)])]
    )
    res = await make(model, limits=Limits(max_tool_calls=4)).run("loop")
    assert (res.status, res.reason) == ("max_steps", "max_tool_calls")
    ran = [c for c in res.tool_calls if c["status"] == "ok"]
    assert len(ran) == 4  # the fifth and sixth were refused, not run


async def test_token_budget_from_usage() -> None:
    counter = iter(range(1000))
    model = ScriptedModel(
        [
            lambda b: Reply(
                tool_calls=(("weather", {"city": f"c{next(counter)}"}),),
                prompt_tokens=600,
                completion_tokens=50,
            )
        ]
    )
    res = await make(model, limits=Limits(max_tokens=1000)).run("loop")
    assert (res.status, res.reason) == ("budget", "tokens")
    assert res.tokens["total"] >= 1000 and "token budget" in res.answer
    assert not any(r.get("response_format") for r in model.requests)  # no extra model call


async def test_wall_clock_limit() -> None:
    async def slowpoke(x: str) -> str:
        """Slow.

        Args:
            x: anything
        """
        await asyncio.sleep(0.3)
        return x

    counter = iter(range(1000))
    model = ScriptedModel([lambda b: call("slowpoke", x=f"v{next(counter)}")])
    res = await make(model, slowpoke, limits=Limits(wall_clock_s=0.5)).run("loop")
    assert (res.status, res.reason) == ("budget", "wall_clock")
    assert res.elapsed_s < 1.5


async def test_no_progress_detector() -> None:
    def broken(x: str) -> str:
        """Always fails.

        Args:
            x: anything
        """
        raise RuntimeError("backend down")

    counter = iter(range(1000))
    model = ScriptedModel([lambda b: call("broken", x=f"v{next(counter)}")], answer="failed")
    res = await make(model, broken, limits=Limits(no_progress_steps=2)).run("loop")
    assert (res.status, res.reason, res.answer) == ("max_steps", "no_progress", "failed")
    assert len(res.tool_calls) == 2 and {c["status"] for c in res.tool_calls} == {"error"}


async def test_failing_tool_then_repeat_ends_with_structured_error() -> None:
    def broken(x: str) -> str:
        """Always fails.

        Args:
            x: anything
        """
        raise RuntimeError("backend down")

    model = ScriptedModel([call("broken", x="a")], answer="the tool failed")
    res = await make(model, broken).run("use broken")
    assert (res.status, res.reason) == ("done", "repeated_call")
    tool = next(s for s in res.history if isinstance(s, ToolStep))
    assert tool.status == "error" and tool.error_type == "tool_error"
    assert "backend down" in model.requests[-1]["messages"][-1]["content"]


async def test_timeout_cancels_the_tool() -> None:
    state = {"cancelled": False}

    async def hang(x: str) -> str:
        """Hangs.

        Args:
            x: anything
        """
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return x

    model = ScriptedModel([call("hang", x="a")])
    t0 = time.perf_counter()
    res = await make(model, hang, limits=Limits(tool_timeout_s=0.2)).run("hang")
    assert time.perf_counter() - t0 < 2
    tool = next(s for s in res.history if isinstance(s, ToolStep))
    assert tool.error_type == "timeout" and state["cancelled"]


async def test_allowlist_hides_and_refuses_other_tools() -> None:
    def delete_all(confirm: bool) -> str:
        """Delete everything.

        Args:
            confirm: yes
        """
        raise AssertionError("must never run")

    model = ScriptedModel([call("delete_all", confirm=True), text("ok")])
    res = await make(model, weather, delete_all, allow=["weather"]).run("q")
    offered = [t["function"]["name"] for t in model.chat_requests[0]["tools"]]
    assert offered == ["weather"]
    tool = next(s for s in res.history if isinstance(s, ToolStep))
    assert tool.status == "error" and tool.error_type == "not_allowed"


async def test_model_error_ends_with_status_error() -> None:
    model = ScriptedModel([Reply(status=500)])
    res = await make(model).run("q")
    assert (res.status, res.reason) == ("error", "model_error")
    assert "500" in res.answer


async def test_each_model_call_carries_its_trace_id_as_request_id() -> None:
    model = ScriptedModel([call("weather", city="Paris")])
    res = await make(model).run("q")
    ids = [h["x-request-id"] for h in model.headers]
    steps = [s.trace_id for s in res.history if isinstance(s, ModelStep)]
    assert ids[: len(steps)] == steps and all(i.startswith(res.run_id) for i in ids)
    assert {h["x-session-id"] for h in model.headers} == {res.run_id}


async def test_trace_file_lines() -> None:
    model = ScriptedModel([call("weather", city="Paris")], answer="18")
    res = await make(model, limits=Limits(repeat_nudges=0)).run("q")
    lines = load_trace(res.trace_path)
    assert [x["type"] for x in lines] == ["start", "model", "tool", "model", "final"]
    for x in lines:
        assert {"run_id", "trace_id", "step", "type", "ts", "latency_s"} <= x.keys()
        assert x["run_id"] == res.run_id and isinstance(x["step"], int)
    assert lines[0]["input"] == "q" and lines[0]["memory_block"] == ""
    m, t = lines[1], lines[2]
    assert m["decision"] == "tool_calls" and m["prompt_tokens"] == 100
    assert m["completion_tokens"] == 10
    assert t["name"] == "weather" and t["arguments"] == {"city": "Paris"}
    assert t["status"] == "ok" and t["result_chars"] > 0 and "Paris" in t["result_summary"]


async def test_wall_clock_bounds_a_hanging_tool() -> None:
    async def hang(x: str) -> str:
        """Hangs.

        Args:
            x: anything
        """
        await asyncio.sleep(30)
        return x

    model = ScriptedModel([call("hang", x="a")])
    t0 = time.perf_counter()
    limits = Limits(wall_clock_s=0.4, tool_timeout_s=30)
    res = await make(model, hang, limits=limits).run("hang")
    assert time.perf_counter() - t0 < 2
    assert (res.status, res.reason) == ("budget", "wall_clock")
    assert res.tool_calls[0]["status"] == "error"


async def test_wall_clock_bounds_a_slow_model_despite_client_retries() -> None:
    import httpx2
    from openai import AsyncOpenAI

    model = ScriptedModel([call("weather", city="Paris")])

    async def slow(request: httpx2.Request) -> httpx2.Response:
        await asyncio.sleep(10)
        return model(request)

    client = AsyncOpenAI(
        base_url="http://scripted/v1",
        api_key="k",
        max_retries=2,  # retries must not stretch the run past its wall clock
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(slow)),
    )
    agent = Agent(client, "m", ToolRegistry([weather]), AgentConfig(Limits(wall_clock_s=0.5)))
    t0 = time.perf_counter()
    res = await agent.run("q")
    assert time.perf_counter() - t0 < 2
    assert (res.status, res.reason) == ("budget", "wall_clock")
    assert any(isinstance(s, LimitStep) and s.reason == "wall_clock" for s in res.history)
