"""The README's own agent examples against the real model: the answer carries the values the
tools returned (before the grounding of forced answers, these answered "fahrenheit" and
"time__get_current_time({")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from loopstack.agent.observe.handoff import exit_code
from tests.integration.conftest import API_KEY, Server
from tests.integration.test_agent import TOOLS, check_contract

pytestmark = [pytest.mark.integration, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_tools() -> str:
    """The `tools.py` the README shows, as written there."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    return next(b for b in blocks if b.startswith("# tools.py"))


def run_agent(server: Server, home: Path, goal: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "LOOPSTACK_API_KEY": API_KEY, "LOOPSTACK_HOME": str(home)}
    cmd = [sys.executable, "-m", "loopstack", "agent", "run", goal, *args]
    cmd += ["--base-url", server.base_url + "/v1", "--no-memory", "--timeout", "500", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    # the process exits with its status's code (0 only for done: loopstack.agent.observe.handoff)
    assert proc.returncode == exit_code(out["status"]), proc.stderr[-2000:]
    out["trace"] = [json.loads(x) for x in Path(out["trace_path"]).read_text().splitlines()]
    return out


def test_readme_examples_answer_with_the_tool_values(server: Server, tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(readme_tools())
    logged = tmp_path / "weather_tools.py"
    logged.write_text(TOOLS)
    time_server = "mcp-server-time --local-timezone UTC"
    with ThreadPoolExecutor(3) as pool:  # the three runs share the engine's batches
        contract = pool.submit(
            run_agent, server, tmp_path / "c", "What is the weather in Paris right now?",
            "--tools", str(logged),
        )  # fmt: skip
        weather = pool.submit(
            run_agent, server, tmp_path / "a", "What is the weather in Tokyo in fahrenheit?",
            "--tools", str(tools),
        )  # fmt: skip
        clock = pool.submit(
            run_agent, server, tmp_path / "b", "What time is it now in Tokyo?",
            "--mcp", time_server,
        )  # fmt: skip
        w, t = weather.result(), clock.result()
        check_contract(contract.result(), logged)

    ran = [c for c in w["tool_calls"] if c["name"] == "get_weather" and c["status"] == "ok"]
    assert ran, w
    assert re.search(r"(?<![\d.])18(?![\d])", w["answer"]), w["answer"]  # the tool's temperature
    assert w["answer"].strip().lower() != "fahrenheit"

    results = [e for e in t["trace"] if e["type"] == "tool" and e["status"] == "ok"]
    assert results and results[0]["name"] == "time__get_current_time", t
    stamp = re.search(r"T(\d{2}):(\d{2})", results[0]["result_summary"])
    assert stamp, results[0]
    hour, minute = stamp.groups()
    # "16:21" (or "9:05" for 09:05); an ISO stamp "...T16:21:44+09:00" holds it too
    clock = rf"(?<![\d:])(?:{int(hour)}|{hour}):{minute}(?!\d)"
    assert re.search(clock, t["answer"]), t["answer"]
    assert "time__get_current_time(" not in t["answer"]
