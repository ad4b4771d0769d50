"""Registry: schema from signatures, validation, trimming, tools files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest

from loopstack.agent.exceptions import ConfigError
from loopstack.agent.protocols import Tool
from loopstack.agent.tools.registry import (
    FunctionTool,
    ToolRegistry,
    load_tools_file,
    schema_from_function,
    trim,
)


def report(
    region: str,
    month: Literal["jan", "feb"],
    limit: int = 10,
    note: str | None = None,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """Monthly sales report for one region.

    Longer text that is not part of the description.

    Args:
        region: Sales region, e.g. West.
        month: Month to report.
        limit (int): Most rows
            to return.
    """
    return {"region": region}


def test_schema_from_signature_and_docstring() -> None:
    desc, schema = schema_from_function(report)
    assert desc == "Monthly sales report for one region."
    props = schema["properties"]
    assert schema["required"] == ["region", "month"]
    assert props["region"] == {"type": "string", "description": "Sales region, e.g. West."}
    assert props["month"]["enum"] == ["jan", "feb"]
    assert props["limit"] == {
        "type": "integer",
        "default": 10,
        "description": "Most rows to return.",
    }
    assert props["note"] == {"type": "string"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert schema["additionalProperties"] is False


async def test_arguments_are_validated_before_execution() -> None:
    reg = ToolRegistry([report])
    bad = await reg.execute("report", {"region": "W", "month": "mar"})
    assert bad.status == "error" and bad.error is not None
    assert bad.error["type"] == "invalid_arguments" and "month" in bad.error["message"]
    assert (await reg.execute("report", '{"region": 1, "month": "jan"}')).status == "error"
    ok = await reg.execute("report", {"region": "W", "month": "jan"})
    assert ok.status == "ok" and ok.data == {"region": "W"}
    missing = await reg.execute("nope", {})
    assert missing.error is not None and missing.error["type"] == "not_allowed"


def test_trim_puts_a_summary_first() -> None:
    rows = [{"id": i, "name": f"row {i}"} for i in range(42)]
    out = trim(rows, max_chars=4000, max_items=20)
    assert list(out) == ["summary", "rows"]
    assert out["summary"] == "42 rows, showing the first 20" and len(out["rows"]) == 20
    big = trim("x" * 9000, max_chars=1000, max_items=20)
    assert big["summary"].startswith("9000 characters, showing the first 9")
    assert len(json.dumps(big)) <= 1000  # the header counts against the limit (issue #44)
    assert trim([1, 2], 100, 20) == [1, 2]


async def test_large_results_are_trimmed_by_execute() -> None:
    def rows(n: int) -> list[int]:
        """Rows.

        Args:
            n: count
        """
        return list(range(n))

    res = await ToolRegistry([rows], max_result_items=5).execute("rows", {"n": 42})
    assert res.data["summary"] == "42 rows, showing the first 5"


def test_groups_and_mount() -> None:
    def a(x: int) -> int:
        """A.

        Args:
            x: x
        """
        return x

    reg = ToolRegistry()
    reg.add(report, group="sales")
    reg.add(a, group="math")
    assert reg.groups() == {"sales": ["report"], "math": ["a"]}
    assert reg.mount(["math"]).names() == ["a"]
    assert reg.mount(None, allow=["report"]).names() == ["report"]
    assert [t["function"]["name"] for t in reg.openai_tools(["a"])] == ["a"]
    assert isinstance(FunctionTool(a), Tool)
    with pytest.raises(ConfigError):
        reg.add(a)


def test_tools_file(tmp_path: Path) -> None:
    f = tmp_path / "mytools.py"
    f.write_text(
        textwrap.dedent(
            '''
            from loopstack.agent.tools.registry import tool
            DANGEROUS = {"rm"}

            def add(a: int, b: int) -> int:
                """Add two numbers."""
                return a + b

            def rm(path: str) -> str:
                """Remove a file."""
                return path

            @tool(dangerous=True)
            def shutdown(now: bool = False) -> str:
                """Shut down."""
                return "bye"

            def undocumented(a: int) -> int:
                return a

            def untyped(a):
                """No hints."""

            def _private(a: int) -> int:
                """Private."""
                return a
            '''
        )
    )
    tools = {t.name: t for t in load_tools_file(f)}
    assert sorted(tools) == ["add", "rm", "shutdown"]
    assert not tools["add"].dangerous and tools["rm"].dangerous and tools["shutdown"].dangerous
    with pytest.raises(ConfigError):
        load_tools_file(tmp_path / "missing.py")


def test_a_sync_tool_abandoned_on_timeout_does_not_keep_the_process_alive() -> None:
    """asyncio.to_thread's executor is joined on exit: the CLI hung until the tool returned."""
    import subprocess
    import sys
    import time

    code = (
        "import asyncio, time\n"
        "from loopstack.agent.tools.registry import in_daemon_thread\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(in_daemon_thread(lambda s: time.sleep(s), s=60), 0.2)\n"
        "    except TimeoutError:\n"
        "        print('timed out')\n"
        "    print(await in_daemon_thread(lambda x: x * 2, x=21))\n"
        "asyncio.run(main())\n"
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.split() == ["timed", "out", "42"]
    assert time.monotonic() - t0 < 20
