"""The agent CLI's `--json` contract, checked on a real run by test_agent_answers.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

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


def check_contract(out: dict[str, Any], tools: Path) -> None:
    """The `--json` contract of a run that used TOOLS (see test_agent_answers.py, which runs
    it beside the README examples so that the three runs share the engine's batches)."""
    assert set(out) >= {"status", "answer", "steps", "tool_calls", "trace_path"}
    assert out["status"] == "done", out
    assert out["answer"].strip()
    ran = [c for c in out["tool_calls"] if c["name"] == "get_weather" and c["status"] == "ok"]
    assert ran, out
    calls = [json.loads(x) for x in tools.with_suffix(".calls").read_text().splitlines()]
    assert any("paris" in c["city"].lower() for c in calls)
    lines = out["trace"]
    assert lines[-1]["type"] == "final" and lines[0]["type"] == "start"
    assert lines[1]["type"] == "model" and lines[1]["prompt_tokens"] > 0  # the server's usage
