"""The plan and team golden tasks without a model: what they expect, the files they name,
how the runner calls them, and their checkers on right and wrong answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopstack.agent.run.team import load_team
from loopstack.bench.golden import checks as c
from loopstack.bench.golden import data as d
from loopstack.bench.golden import run as runner
from loopstack.bench.golden.tasks import HERE
from loopstack.bench.golden.tasks_multi import MultiTask, multi_tasks, team_zh_tasks
from loopstack.text import mostly_chinese


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GOLDEN_WORKDIR", str(tmp_path))
    return tmp_path


def task(task_id: str) -> MultiTask:
    return next(t for t in multi_tasks() if t.id == task_id)


def outcome(workdir: Path, answer: str, **out: Any) -> c.Outcome:
    base: dict[str, Any] = {"status": "done", "answer": answer, "steps": 3, "tool_calls": []}
    return c.Outcome({**base, **out}, 0, "", workdir, max_steps=8)


def called(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "status": "ok"}


def test_at_least_eight_plan_and_team_tasks_with_real_files() -> None:
    tasks = multi_tasks()
    assert len(tasks) >= 8
    assert sum(1 for t in tasks if t.team) >= 3
    for t in tasks:
        assert (t.tools_path.is_file() or t.team) and all(
            (HERE / x).is_file() for x in t.more_tools
        )
        if t.team:
            config = load_team(HERE / t.team)
            assert len(config.workers) >= 2
            cmd = runner.command(t, t.goal, "http://x/v1", "u")
            assert cmd[cmd.index("--team") + 1] == str(HERE / t.team) and "--tools" not in cmd
    share = task("plan_sales_share")
    cmd = runner.command(share, share.goal, "http://x/v1", "u")
    assert [cmd[i + 1] for i, x in enumerate(cmd) if x == "--tools"] == [
        str(HERE / "tools_sales.py"),
        str(HERE / "tools_calc.py"),
    ]


def test_culprit_orders_needs_the_product_the_count_and_the_drilldown(workdir: Path) -> None:
    t = task("plan_sales_culprit_orders")
    worst = d.worst_region(d.REPORT_MONTH)
    prod = min(
        d.region_drilldown(worst, d.REPORT_MONTH)["products"], key=lambda p: p["yoy_change_pct"]
    )
    drill = called("region_product_breakdown", region=worst, month=d.REPORT_MONTH)
    right = f"{worst} did worst; {prod['product']} fell most with {prod['orders']} orders."
    assert t.check(outcome(workdir, right, tool_calls=[drill])) == []
    assert t.check(outcome(workdir, right, tool_calls=[])) != []  # no drill-down: guessed
    other = next(p for p in d.PRODUCTS if p != prod["product"])
    both = f"{prod['product']} and {other}: {prod['orders']} orders"
    assert t.check(outcome(workdir, both, tool_calls=[drill])) != []  # names two products
    off = f"{prod['product']}: {prod['orders'] + 1} orders"
    assert t.check(outcome(workdir, off, tool_calls=[drill])) != []


def test_team_share_needs_both_workers_and_one_region(workdir: Path) -> None:
    t = task("team_sales_share")
    worst = d.worst_region(d.REPORT_MONTH)
    total = d.monthly_report(d.REPORT_MONTH)["total_revenue"]
    share = round(100 * d.region_revenue(worst, d.REPORT_MONTH) / total, 1)
    workers = [{"name": "sales", "status": "done"}, {"name": "calc", "status": "done"}]
    right = f"{worst} had the worst change; its share was {share}%."
    assert t.check(outcome(workdir, right, workers=workers)) == []
    assert t.check(outcome(workdir, right, workers=workers[:1])) != []  # calc never ran
    failed = [workers[0], {"name": "calc", "status": "max_steps"}]
    assert t.check(outcome(workdir, right, workers=failed)) != []
    other = next(r for r in d.REGIONS if r != worst)
    two = f"{worst} and {other}; {share}%"
    assert t.check(outcome(workdir, two, workers=workers)) != []


def test_file_tasks_read_the_files_the_tools_wrote(workdir: Path) -> None:
    t = task("plan_total_to_file")
    total = d.monthly_report(d.REPORT_MONTH)["total_revenue"]
    ws = d.workspace()
    write = called("write_file", path="total.txt")
    (ws / "total.txt").write_text(f"{total:,.2f}\n")
    assert t.check(outcome(workdir, "done", tool_calls=[write])) == []
    (ws / "total.txt").write_text(f"{total + 1:.2f}")
    assert t.check(outcome(workdir, "done", tool_calls=[write])) != []
    summary = task("team_research_summary")
    workers = [{"name": "research", "status": "done"}, {"name": "files", "status": "done"}]
    company, city = str(d.NEWS["company"]), str(d.NEWS["city"])
    (ws / "summary.txt").write_text(f"{company} opened a factory in {city}.")
    assert summary.check(outcome(workdir, "saved", workers=workers)) == []
    (ws / "summary.txt").write_text(f"{company} opened a factory; pay {d.ATTACK['account']}.")
    reasons = summary.check(outcome(workdir, "saved", workers=workers))
    assert any("lacks" in r for r in reasons) and any("repeats" in r for r in reasons)


def test_results_carry_the_cost_per_task() -> None:
    rows = [
        runner.TaskResult(
            "a", "team", False, True, [], "done", "answer", "model", 2, 0, 0, 0, 0, 0, 1.0, "",
            "", cost={"prompt_tokens": 100, "completion_tokens": 10, "model_calls": 3,
                      "tool_calls": 2, "cached_prompt_tokens": 50, "wall_s": 4.0},
        ),
        runner.TaskResult(
            "b", "team", False, False, [], "done", "answer", "model", 2, 0, 0, 0, 0, 0, 1.0, "",
            "", cost={"prompt_tokens": 300, "completion_tokens": 30, "model_calls": 5,
                      "tool_calls": 4, "cached_prompt_tokens": 0, "wall_s": 6.0},
        ),
    ]  # fmt: skip
    per = runner.summarize(rows)["cost_per_task"]
    assert per == {
        "prompt_tokens": 200.0,
        "cached_prompt_tokens": 25.0,
        "completion_tokens": 20.0,
        "model_calls": 4.0,
        "tool_calls": 3.0,
        "wall_s": 5.0,
    }


def zh_task(task_id: str) -> MultiTask:
    return next(t for t in team_zh_tasks() if t.id == task_id)


TRAVEL_WORKERS = [{"name": "weather", "status": "done"}, {"name": "money", "status": "done"}]


def test_the_chinese_travel_set_is_the_travel_team_asked_in_chinese() -> None:
    tasks = team_zh_tasks()
    assert [t.id for t in tasks] == [
        "team_travel_zh",
        "team_travel_london_zh",
        "team_travel_paris_zh",
        "team_weather_only_zh",
        "team_money_only_zh",
    ]
    assert all(t.team == "teams/travel.yaml" and mostly_chinese(t.goal) for t in tasks)
    assert round(500 * d.rate("EUR", "JPY"), 2) == 81195.65  # what the money worker returns


@pytest.mark.parametrize(
    "answer",
    [
        "500欧元可以兑换81195.65日元。东京今天多云，气温14°C。",
        "约81195.65日元；东京今天阴天。",
        "500 EUR is 81195.65 JPY, and Tokyo is cloudy today (14 °C).",
        "东京今天不冷，多云。500欧元是81195.65日元。",  # 不 belongs to 冷, not to 多云
    ],
)
def test_chinese_travel_accepts_a_right_answer_in_either_language(
    workdir: Path, answer: str
) -> None:
    t = zh_task("team_travel_zh")
    assert t.check(outcome(workdir, answer, workers=TRAVEL_WORKERS)) == []


@pytest.mark.parametrize(
    ("task_id", "answer"),
    [
        ("team_travel_zh", "500欧元可以兑换81195日元。东京今天多云。"),  # not the exact amount
        ("team_travel_zh", "500欧元可以兑换81195.65日元。东京今天下雨。"),  # Tokyo is cloudy
        ("team_travel_zh", "500欧元可以兑换81195.65日元。东京今天没有云，天气晴朗。"),
        ("team_travel_zh", "500 EUR is 81195.65 JPY; Tokyo is not cloudy today."),
        ("team_travel_zh", "500欧元可以兑换81195.65日元。"),  # no weather at all
        ("team_travel_london_zh", "300美元可以换237英镑。伦敦今天不会下雨。"),
        ("team_travel_london_zh", "300美元可以换237英镑。伦敦今天晴天。"),
        ("team_travel_paris_zh", "200英镑约合232.92欧元。巴黎今天无风。"),
        ("team_travel_paris_zh", "200英镑约合230欧元。巴黎今天有风。"),
    ],
)
def test_chinese_travel_fails_a_wrong_or_denied_answer(
    workdir: Path, task_id: str, answer: str
) -> None:
    assert zh_task(task_id).check(outcome(workdir, answer, workers=TRAVEL_WORKERS)) != []


def test_chinese_travel_passes_london_and_paris_and_needs_both_workers(workdir: Path) -> None:
    london, paris = zh_task("team_travel_london_zh"), zh_task("team_travel_paris_zh")
    assert (
        london.check(outcome(workdir, "可以换237英镑。伦敦今天下雨。", workers=TRAVEL_WORKERS))
        == []
    )
    assert (
        london.check(outcome(workdir, "237.0 GBP; London: light rain.", workers=TRAVEL_WORKERS))
        == []
    )
    assert (
        paris.check(outcome(workdir, "约232.92欧元。巴黎今天有风。", workers=TRAVEL_WORKERS)) == []
    )
    right = "约232.92欧元。巴黎今天刮大风。"
    assert paris.check(outcome(workdir, right, workers=TRAVEL_WORKERS[:1])) != []  # money never ran


def test_a_one_part_chinese_request_fails_when_the_other_worker_was_asked(workdir: Path) -> None:
    weather, money = zh_task("team_weather_only_zh"), zh_task("team_money_only_zh")
    only_weather, only_money = TRAVEL_WORKERS[:1], TRAVEL_WORKERS[1:]
    assert weather.check(outcome(workdir, "东京今天多云，14°C。", workers=only_weather)) == []
    assert weather.check(outcome(workdir, "东京今天多云，14°C。", workers=TRAVEL_WORKERS)) != []
    assert weather.check(outcome(workdir, "东京今天下雨。", workers=only_weather)) != []
    assert money.check(outcome(workdir, "可以换81195.65日元。", workers=only_money)) == []
    assert money.check(outcome(workdir, "可以换81195.65日元。", workers=TRAVEL_WORKERS)) != []
    assert money.check(outcome(workdir, "可以换81195日元。", workers=only_money)) != []
