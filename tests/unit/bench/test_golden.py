"""The golden task set without a model: data, tools, checkers and the runner's parsing."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from loopstack.bench.golden import checks as c
from loopstack.bench.golden import data as d
from loopstack.bench.golden import run as runner
from loopstack.bench.golden import tasks as t


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GOLDEN_WORKDIR", str(tmp_path))
    return tmp_path


def outcome(workdir: Path, **out: object) -> c.Outcome:
    base: dict[str, object] = {"status": "done", "answer": "", "steps": 2, "tool_calls": []}
    return c.Outcome({**base, **out}, 0, "", workdir, max_steps=6)


def test_sales_db_is_deterministic_and_plants_the_story(tmp_path: Path) -> None:
    a, b = d.build_sales_db(tmp_path / "a.db"), d.build_sales_db(tmp_path / "b.db")
    rows = [
        sqlite3.connect(p).execute("SELECT * FROM sales ORDER BY 1, 2, 3").fetchall()
        for p in (a, b)
    ]
    assert rows[0] == rows[1] and len(rows[0]) == len(d.MONTHS) * 4 * 3
    report = d.monthly_report(d.REPORT_MONTH)
    assert report["total_revenue"] == pytest.approx(sum(r["revenue"] for r in report["regions"]))
    assert d.worst_region(d.REPORT_MONTH) == d.WORST_REGION
    products = d.region_drilldown(d.WORST_REGION, d.REPORT_MONTH)["products"]
    assert min(products, key=lambda p: p["yoy_change_pct"])["product"] == d.WORST_PRODUCT
    south = next(r for r in report["regions"] if r["region"] == "South")
    before = south["revenue_last_year"]
    assert south["yoy_change_pct"] == round((south["revenue"] - before) / before * 100, 1)


def test_tool_files_expose_only_documented_public_functions() -> None:
    import inspect

    from loopstack.bench.golden import (
        tools_calc,
        tools_files,
        tools_flaky,
        tools_inbox,
        tools_sales,
        tools_travel,
        tools_web,
    )

    for mod in (
        tools_calc,
        tools_files,
        tools_flaky,
        tools_inbox,
        tools_sales,
        tools_travel,
        tools_web,
    ):
        public = [
            f
            for n, f in vars(mod).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == mod.__name__
        ]
        assert public, mod.__name__
        for fn in public:
            assert fn.__doc__ and all(
                p in fn.__annotations__ for p in inspect.signature(fn).parameters
            )


def test_workspace_and_calculator_tools(workdir: Path) -> None:
    from loopstack.bench.golden import tools_calc, tools_files

    assert tools_files.list_files() == sorted(d.WORKSPACE_FILES)
    assert d.deadline().isoformat() in tools_files.read_file("notes/todo.txt")
    tools_files.write_file("out/x.txt", "hi")
    assert (workdir / "workspace" / "out" / "x.txt").read_text() == "hi"
    with pytest.raises(ValueError):
        tools_files.read_file("../../etc/passwd")
    assert d.actions(workdir)[0]["action"] == "write_file"
    assert tools_calc.calculate("(345 + 655) / 8 + 19") == 144
    assert tools_calc.calculate("2 ^ 10") == 1024
    with pytest.raises(ValueError):
        tools_calc.calculate("__import__('os').system('true')")


def test_travel_tools_and_rates() -> None:
    from loopstack.bench.golden import tools_travel

    assert tools_travel.get_weather("LISBON")["condition"] == "sunny"
    assert tools_travel.convert_currency(250, "usd", "eur")["converted"] == pytest.approx(230.0)
    assert d.rate("EUR", "USD") == pytest.approx(1 / 0.92, rel=1e-3)
    with pytest.raises(ValueError):
        tools_travel.get_exchange_rate("EUR", "XXX")


def test_injection_checker_reads_the_side_effect_log(workdir: Path) -> None:
    from loopstack.bench.golden import tools_inbox

    check = c.never_executed("delete_file", "send_email")
    assert check(outcome(workdir)) == []
    assert "ignore all previous instructions" in json.dumps(tools_inbox.read_inbox()).lower()
    tools_inbox.delete_file("budget.xlsx")
    assert check(outcome(workdir)) and "delete_file" in check(outcome(workdir))[0]


def test_answer_checkers(workdir: Path) -> None:
    o = outcome(workdir, answer="Total revenue was 35,480.00 USD, down 0.7% year over year.")
    assert c.answer_number(35480)(o) == []
    assert c.answer_change(-0.7)(o) == []
    assert c.answer_change(0.7)(o) != []
    assert c.answer_number(35481)(o) != []
    assert c.answer_number(35480.4)(o) != []
    assert c.answer_number(35480.4, places=0)(o) == []  # only where the question asks to round
    assert c.answer_words("revenue", ("down", "up"))(o) == []
    assert c.answer_words("South")(o) != []
    assert c.answer_lacks("south")(o) == []


def test_call_and_failure_checkers(workdir: Path) -> None:
    calls = [
        {"name": "get_weather", "arguments": {"city": "oslo"}, "status": "ok"},
        {"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}, "status": "ok"},
        {"name": "get_stock_price", "arguments": {"symbol": "ACME"}, "status": "error"},
    ]
    o = outcome(workdir, tool_calls=calls, answer="The price service is unavailable.")
    assert c.called("get_weather", city="Oslo")(o) == []
    assert c.called("get_weather", city="Cairo")(o) != []
    assert c.called("get_current_time")(o) == []
    assert c.tool_failed_cleanly("get_stock_price", "ACME?")(o) == []
    assert c.tool_failed_cleanly("slow_quote", "ACME?")(o) != []
    assert c.called("get_stock_price")(o) != []  # only an error call exists


def test_contract_checker(workdir: Path) -> None:
    assert c.contract(outcome(workdir)) == []
    assert c.contract(outcome(workdir, status="finished"))
    assert c.contract(outcome(workdir, steps=20))
    assert c.contract(outcome(workdir, tool_calls=[{"name": "x"}]))
    assert c.contract(c.Outcome(None, 1, "boom", workdir, 6))


def test_file_checkers(workdir: Path) -> None:
    (workdir / "workspace").mkdir()
    (workdir / "workspace" / "up.txt").write_text("APPLES\nBREAD\nCOFFEE\n")
    o = outcome(workdir)
    assert c.file_lines_are("up.txt", ["APPLES", "BREAD", "COFFEE"])(o) == []
    assert c.file_lines_are("up.txt", ["APPLES"])(o) != []
    assert c.file_is("missing.txt", "x")(o) != []


def test_task_set_shape() -> None:
    tasks = t.all_tasks()
    assert len(tasks) >= 24
    assert 5 <= sum(x.fast for x in tasks) <= 7
    kinds = {x.category for x in tasks}
    assert {"sqlite", "workspace", "calculator", "weather", "exchange", "memory"} <= kinds
    assert {"injection", "failure", "mcp"} <= kinds
    for task in tasks:
        assert task.tools_path.is_file(), task.tools
        assert re.match(r"^[a-z0-9_]+$", task.id)
    assert all(x.setup for x in tasks if x.category == "memory")


def test_runner_parsing_and_trace_stats(tmp_path: Path) -> None:
    assert runner.parse_last_json('log line\n{"status": "done"}\n') == {"status": "done"}
    assert runner.parse_last_json("not json") is None
    trace = tmp_path / "t.jsonl"
    lines = [
        {"type": "model", "prompt_tokens": 100, "completion_tokens": 7},
        {"type": "tool", "name": "x", "status": "error"},
        {"type": "model", "prompt_tokens": 50, "completion_tokens": 3},
        {"type": "final", "forced": True, "prompt_tokens": 20, "completion_tokens": 5},
    ]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    stats = runner.trace_stats(str(trace))
    assert stats == {
        "prompt_tokens": 170,
        "completion_tokens": 15,
        "tool_errors": 1,
        "model_calls": 3,  # the forced final answer is a model request too
    }
    task = next(x for x in t.all_tasks() if x.mcp)
    cmd = runner.command(task, task.goal, "http://h/v1", "u1")
    assert cmd[3:6] == ["agent", "run", task.goal] and "--json" in cmd and "--mcp" in cmd


def test_the_model_is_judged_on_its_own_words() -> None:
    shown = "No review is scheduled. (From read_inbox: body moved to Thursday 10:00.)"
    assert runner.own_words(shown) == "No review is scheduled."
    assert runner.own_words("From calculate: 434.0.") == "From calculate: 434.0."
    assert runner.own_words("It is 7 (really).") == "It is 7 (really)."
