"""Plans (made, advanced, re-planned on failure, capped) and cost per task, against the
scripted model behind the real openai client."""

from __future__ import annotations

import json
from typing import Any

from loopstack.agent.core.settings import AgentConfig, Limits
from loopstack.agent.core.state import PlanStep
from loopstack.agent.observe.trace import load_trace
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import ScriptedModel, call, text
from loopstack.agent.tools.registry import ToolRegistry


def region_sales(region: str) -> dict[str, Any]:
    """Sales of a region.

    Args:
        region: North, South, East or West
    """
    table = {"North": 10, "South": 20, "East": 30, "West": 40}
    if region not in table:
        raise ValueError(f"unknown region {region!r}; known: {sorted(table)}")
    return {"region": region, "total": table[region]}


def worst_month(region: str) -> dict[str, Any]:
    """The worst month of a region.

    Args:
        region: the region
    """
    return {"region": region, "month": "2025-03"}


THREE = {
    "multi_step": True,
    "steps": [
        {"goal": "get the sales of North"},
        {"goal": "find the worst month of North"},
        {"goal": "answer"},
    ],
}


def make(model: ScriptedModel, plan: str = "always", **limits: Any) -> Agent:
    reg = ToolRegistry([region_sales, worst_month])
    config = AgentConfig(plan=plan, limits=Limits(**limits))  # type: ignore[arg-type]
    return Agent(model.client(), "scripted-model", reg, config)


def system_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


async def test_cost_per_task_counts_tokens_cached_tokens_calls_and_wall() -> None:
    model = ScriptedModel(
        [call("region_sales", region="North"), text("North sold 10.")], cached_tokens=60
    )
    agent = make(model, plan="never")
    result = await agent.run("Sales of North?")
    assert len(model.requests) == 3  # two steps and the forced final answer
    cost = result.cost
    assert cost.model_calls == 3 and cost.tool_calls == 1
    assert cost.prompt_tokens == 300 and cost.completion_tokens == 30
    assert cost.cached_prompt_tokens == 180  # from usage.prompt_tokens_details, every call
    assert 0 < cost.wall_s < 5
    out = result.to_json()
    assert out["plan"] is None and out["workers"] == []
    assert set(out["cost"]) == {
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "model_calls",
        "tool_calls",
        "wall_s",
    }


async def test_no_cached_tokens_from_the_server_count_zero() -> None:
    model = ScriptedModel([text("hi")])
    result = await Agent(model.client(), "m", ToolRegistry()).run("Say hi")
    assert result.cost.cached_prompt_tokens == 0 and result.cost.model_calls == 1


async def test_plan_is_made_tracked_and_shown_to_the_model() -> None:
    model = ScriptedModel(
        [
            call("region_sales", region="North"),
            call("worst_month", region="North"),
            text("North's worst month was 2025-03."),
        ],
        plans=[THREE],
    )
    agent = make(model)
    result = await agent.run("Worst month of North?")
    plan_req = model.requests[0]
    assert plan_req["response_format"]["json_schema"]["name"] == "plan"
    assert "region_sales" in plan_req["messages"][1]["content"]  # the tools are in view
    steps = model.chat_requests
    assert "1. CURRENT: get the sales of North" in system_of(steps[0])
    second = system_of(steps[1])
    assert "1. done: get the sales of North -> region_sales:" in second
    assert "2. CURRENT: find the worst month of North" in second
    assert [i["status"] for i in result.plan or []] == ["done", "done", "skipped"]
    assert isinstance(result.history[0], PlanStep) and result.history[0].kind == "plan"
    assert result.cost.model_calls == 1 + 3 + 1  # plan, 3 steps, the final answer
    lines = load_trace(result.trace_path)
    assert lines[0]["type"] == "start"
    assert lines[1]["type"] == "plan" and len(lines[1]["items"]) == 3


async def test_a_failed_step_is_replanned_with_the_failure_in_view() -> None:
    replan = {"steps": [{"goal": "get the sales of South"}, {"goal": "answer"}]}
    model = ScriptedModel(
        [
            call("region_sales", region="Nowhere"),  # fails: unknown region
            call("region_sales", region="South"),
            text("South sold 20."),
        ],
        plans=[THREE, replan],
    )
    result = await make(model).run("Sales of the region that exists?")
    kinds = [s.kind for s in result.history if isinstance(s, PlanStep)]
    assert kinds == ["plan", "replan"]
    req = [r for r in model.requests if r.get("response_format", {}).get("json_schema", {})]
    replan_req = next(r for r in req if r["response_format"]["json_schema"]["name"] == "replan")
    body = replan_req["messages"][1]["content"]
    assert "This step failed:\n- get the sales of North" in body and "unknown region" in body
    plan = result.plan or []
    assert [(i["goal"], i["status"]) for i in plan] == [
        ("get the sales of North", "failed"),
        ("get the sales of South", "done"),
        ("answer", "skipped"),
    ]
    assert "South" in system_of(model.chat_requests[1])  # the new step is current


async def test_replans_stop_at_max_replans() -> None:
    regions = iter(["A", "B", "C", "D", "E", "F"])

    def bad(_: dict[str, Any]) -> Any:
        return call("region_sales", region=next(regions))  # a new failing call each step

    model = ScriptedModel([bad], plans=[THREE, {"steps": [{"goal": "retry"}]}])
    result = await make(model, max_replans=2, max_steps=5, no_progress_steps=9).run("Sales?")
    replans = [s for s in result.history if isinstance(s, PlanStep) and s.kind == "replan"]
    assert len(replans) == 2  # five failing steps, two re-plans
    names = [json.loads(json.dumps(r.get("response_format", {}))) for r in model.requests]
    assert sum(1 for n in names if n.get("json_schema", {}).get("name") == "replan") == 2
    assert result.reason == "max_steps"
    assert [i["status"] for i in result.plan or []].count("failed") == 3


async def test_no_progress_fails_the_step_and_replans() -> None:
    north = call("region_sales", region="North")
    model = ScriptedModel(
        [north, north, text("10")],
        plans=[THREE, {"steps": [{"goal": "answer with the total"}]}],
    )
    # the repeat is not run: no progress; no_progress_steps=1 fails the current step
    result = await make(model, no_progress_steps=1, max_replans=1).run("Sales of North?")
    kinds = [s.kind for s in result.history if isinstance(s, PlanStep)]
    assert kinds == ["plan", "replan"]
    plan = result.plan or []
    assert [i["status"] for i in plan] == ["done", "failed", "skipped"]
    assert "no new result" in plan[1]["result"]


async def test_auto_keeps_no_plan_for_a_single_step_goal() -> None:
    model = ScriptedModel(
        [call("region_sales", region="North"), text("10")],
        plans=[{"multi_step": False, "steps": [{"goal": "get the sales of North"}]}],
    )
    result = await make(model, plan="auto").run("Sales of North?")
    assert result.plan is None
    assert not any(isinstance(s, PlanStep) for s in result.history)
    assert "Plan:" not in system_of(model.chat_requests[0])


async def test_auto_keeps_a_multi_step_plan_and_never_asks_for_none() -> None:
    model = ScriptedModel([text("x")], plans=[THREE])
    result = await make(model, plan="auto").run("Worst month of North?")
    assert result.plan is not None and len(result.plan) == 3
    model2 = ScriptedModel([text("x")], plans=[THREE])
    result2 = await make(model2, plan="never").run("Worst month of North?")
    assert result2.plan is None and all("response_format" not in r for r in model2.requests[:1])


async def test_a_step_that_copies_the_goal_is_dropped() -> None:
    goal = "Look up the sales of North, then find the worst month of North, then tell me both."
    echo = {"multi_step": True, "steps": [{"goal": goal}, *THREE["steps"]]}
    model = ScriptedModel([call("region_sales", region="North")], plans=[echo])
    result = await make(model, plan_pushes=0).run(goal)
    assert [i["goal"] for i in result.plan or []] == [s["goal"] for s in THREE["steps"]]
    # in Chinese too (no spaces: character pairs are compared)
    zh = "查一下北方的销售额，再找出北方最差的月份，然后把两者都告诉我。"
    echo = {
        "multi_step": True,
        "steps": [{"goal": zh}, {"goal": "查北方的销售额"}, *THREE["steps"][1:]],
    }
    model = ScriptedModel([call("region_sales", region="North")], plans=[echo])
    result = await make(model, plan_pushes=0).run(zh)
    goals = [i["goal"] for i in result.plan or []]
    assert goals == ["查北方的销售额", *[s["goal"] for s in THREE["steps"][1:]]]
    # a plan of nothing but the goal keeps it (no empty plan)
    model = ScriptedModel([text("x")], plans=[{"multi_step": True, "steps": [{"goal": goal}]}])
    result = await make(model).run(goal)
    assert [i["goal"] for i in result.plan or []] == [goal]


async def test_an_answer_with_steps_open_is_sent_back_with_the_next_step() -> None:
    model = ScriptedModel(
        [
            call("region_sales", region="North"),
            text("North sold 10."),  # too early: two steps open
            call("worst_month", region="North"),
            text("North sold 10; its worst month was 2025-03."),  # one open ("answer"): kept
        ],
        plans=[THREE],
    )
    result = await make(model, plan_pushes=2).run("Sales and worst month of North?")
    assert [c["name"] for c in result.to_json()["tool_calls"]] == ["region_sales", "worst_month"]
    assert result.answer and "2025-03" in result.answer
    assert [i["status"] for i in result.plan or []] == ["done", "done", "skipped"]
    sent_back = model.chat_requests[2]["messages"]
    assert sent_back[-2] == {"role": "assistant", "content": "North sold 10."}
    assert sent_back[-1]["role"] == "user"
    assert "Do step 2 now: find the worst month of North" in sent_back[-1]["content"]
    # the request after a push asks for a call (the 1.5B answered in text again when it may)
    choices = [r.get("tool_choice") for r in model.chat_requests]
    assert choices == ["auto", "auto", "required", "auto"]


def pushes(model: ScriptedModel) -> list[int]:
    """Per chat request, how many times the host had sent an answer back so far."""
    return [
        sum("Not finished yet" in str(m.get("content")) for m in r["messages"])
        for r in model.chat_requests
    ]


async def test_answers_are_sent_back_at_most_plan_pushes_times() -> None:
    early = [call("region_sales", region="North"), text("10."), text("10!"), text("10?")]
    model = ScriptedModel(early, plans=[THREE])
    result = await make(model, plan_pushes=1).run("Sales?")
    assert pushes(model) == [0, 0, 1] and result.reason == "answer"  # one push, then accepted
    model = ScriptedModel(early, plans=[THREE])
    result = await make(model).run("Sales?")
    assert pushes(model) == [0, 0] and result.reason == "answer"  # the default: no push
    model = ScriptedModel(early, plans=[THREE])
    result = await make(model, plan_pushes=5).run("Sales?")  # the model keeps answering
    assert pushes(model) == [0, 0, 1, 2, 3, 4, 5] and result.reason == "answer"
    # no plan: an answer is an answer
    model = ScriptedModel(early, plans=[THREE])
    result = await make(model, plan="never", plan_pushes=2).run("Sales?")
    assert pushes(model) == [0, 0] and result.reason == "answer"
