"""Tool selection in the agent runtime (loopstack.agent.core.selection) with the scripted model."""

from __future__ import annotations

from typing import Any

from loopstack.agent.core.selection import MORE_TOOLS, ToolSelection
from loopstack.agent.core.settings import AgentConfig
from loopstack.agent.core.state import FinalStep, ToolStep
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import ScriptedModel, call, text
from loopstack.agent.tools.registry import ToolRegistry


def sales_by_product(region: str) -> dict[str, Any]:
    """Sales broken down by product for one region.

    Args:
        region: the sales region
    """
    return {"region": region, "widgets": 10}


def read_file(path: str) -> str:
    """Read a text file from the workspace.

    Args:
        path: file path
    """
    return "notes"


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: the city
    """
    return {"city": city, "temperature": 18}


def convert_currency(amount: float, to: str) -> float:
    """Convert an amount of money into another currency.

    Args:
        amount: how much
        to: the target currency
    """
    return amount * 2


TOOLS = [sales_by_product, read_file, get_weather, convert_currency]


def names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def make(model: ScriptedModel, **kw: Any) -> Agent:
    return Agent(model.client(), "scripted-model", ToolRegistry(TOOLS), AgentConfig(**kw))


GOAL = "What is the weather in Paris city?"


async def test_given_order_is_the_default() -> None:
    model = ScriptedModel([call("get_weather", city="Paris")])
    await make(model).run(GOAL)
    assert names(model.chat_requests[0]) == [f.__name__ for f in TOOLS]
    assert "loopstack" not in model.chat_requests[0]  # an ordinary request


async def test_ranked_asks_the_endpoint_with_the_goal_on_every_step() -> None:
    model = ScriptedModel(
        [call("get_weather", city="Paris"), call("convert_currency", amount=1, to="EUR")]
    )
    result = await make(model, selection=ToolSelection("ranked")).run(GOAL)
    ranks = [r["loopstack"]["tool_rank"] for r in model.chat_requests]
    assert len(ranks) >= 2 and all(r == ranks[0] for r in ranks)  # one order per run
    assert ranks[0]["query"] == GOAL and "top_k" not in ranks[0]
    assert MORE_TOOLS in ranks[0]["always"]
    assert names(model.chat_requests[0]) == [f.__name__ for f in TOOLS]
    assert result.status == "done"


async def test_top_k_offers_the_best_and_more_tools_brings_the_rest() -> None:
    model = ScriptedModel(
        [call(MORE_TOOLS), call("read_file", path="a.txt"), text("It says notes.")]
    )
    agent = make(model, selection=ToolSelection("ranked", 2), text_answers="accept")
    steps = [s async for s in agent.steps(GOAL)]
    first, second = model.chat_requests[:2]
    assert first["loopstack"]["tool_rank"]["top_k"] == 2 and names(first)[-1] == MORE_TOOLS
    assert "top_k" not in second["loopstack"]["tool_rank"] and MORE_TOOLS not in names(second)
    more = next(s for s in steps if isinstance(s, ToolStep) and s.name == MORE_TOOLS)
    assert more.status == "ok"
    ran = [s.name for s in steps if isinstance(s, ToolStep)]
    assert ran == [MORE_TOOLS, "read_file"]
    assert isinstance(steps[-1], FinalStep) and steps[-1].answer == "It says notes."
    # hiding one tool behind another saves nothing: then no cut at all
    model = ScriptedModel([call("get_weather", city="Paris")])
    await make(model, selection=ToolSelection("ranked", 3)).run(GOAL)
    req = model.chat_requests[0]
    assert "top_k" not in req["loopstack"]["tool_rank"] and MORE_TOOLS not in names(req)


async def test_no_repeat_is_asked_of_the_server_on_every_step_with_tools() -> None:
    model = ScriptedModel([call("get_weather", city="Paris"), text("18 degrees")])
    await make(model, selection=ToolSelection(no_repeat=True), text_answers="accept").run(
        "Weather in Paris?"
    )
    assert all(r["loopstack"] == {"no_repeat": True} for r in model.chat_requests)
    final = model.requests[-1]
    assert "tools" in final  # the answer came from a step, not from a forced request


async def test_the_answer_tool_ends_the_run_with_the_models_own_answer() -> None:
    from loopstack.agent.core.selection import ANSWER_TOOL

    model = ScriptedModel(
        [call("get_weather", city="Paris"), call(ANSWER_TOOL, answer="18 degrees in Paris")]
    )
    steps = [
        s
        async for s in make(model, selection=ToolSelection(answer_tool=True)).steps(
            "Weather in Paris?"
        )
    ]
    final = steps[-1]
    assert isinstance(final, FinalStep)
    assert (final.reason, final.answer, final.forced) == ("answer", "18 degrees in Paris", False)
    assert names(model.chat_requests[0])[-1] == ANSWER_TOOL  # offered last: a stable prefix
    # stated: no ranking, so a server's default ranking and floor cannot cut the answer tool
    assert model.chat_requests[0]["loopstack"] == {"tool_rank": None}
    assert not any(r.get("response_format") for r in model.requests)  # no forced request
    assert [s.name for s in steps if isinstance(s, ToolStep)] == ["get_weather"]


async def test_an_answer_call_before_any_lookup_is_nudged_to_a_tool_first() -> None:
    from loopstack.agent.core.selection import ANSWER_TOOL

    model = ScriptedModel(
        [
            call(ANSWER_TOOL, answer="guess"),
            call("get_weather", city="Paris"),
            call(ANSWER_TOOL, answer="18"),
        ]
    )
    result = await make(model, selection=ToolSelection(answer_tool=True)).run("Weather in Paris?")
    assert result.answer == "18"
    nudged = model.chat_requests[1]
    assert nudged["tool_choice"] == "required" and ANSWER_TOOL not in names(nudged)
