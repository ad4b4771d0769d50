"""The agent CLI against the real server: one run through the `--json` contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOOLS = textwrap.dedent(
    '''
    import json
    from pathlib import Path

    LOG = Path(__file__).with_suffix(".calls")


    def get_weather(city: str) -> dict:
        """Current weather for a city.

        Args:
            city: City name, e.g. Paris.
        """
        with LOG.open("a") as f:
            f.write(json.dumps({"city": city}) + "\\n")
        return {"city": city, "temperature_c": 18, "conditions": "cloudy"}
    '''
)


def test_agent_run_json_contract(server: Server, tmp_path: Path) -> None:
    tools = tmp_path / "weather_tools.py"
    tools.write_text(TOOLS)
    env = {
        **os.environ,
        "LOOPSTACK_API_KEY": API_KEY,
        "LOOPSTACK_HOME": str(tmp_path / "home"),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopstack",
            "agent",
            "run",
            "What is the weather in Paris right now?",
            "--tools",
            str(tools),
            "--base-url",
            server.base_url + "/v1",
            "--no-memory",
            "--timeout",
            "500",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # ~20 s on an idle machine; the shared server may be busy
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) >= {"status", "answer", "steps", "tool_calls", "trace_path"}
    assert out["status"] == "done", out
    assert out["answer"].strip()
    ran = [c for c in out["tool_calls"] if c["name"] == "get_weather" and c["status"] == "ok"]
    assert ran, out
    calls = [json.loads(x) for x in tools.with_suffix(".calls").read_text().splitlines()]
    assert any("paris" in c["city"].lower() for c in calls)
    lines = [json.loads(x) for x in Path(out["trace_path"]).read_text().splitlines()]
    assert lines[-1]["type"] == "final" and lines[0]["type"] == "model"
    assert lines[0]["prompt_tokens"] > 0  # counted from the server's usage
