"""Worked examples for the final answer, bootstrapped from the agent's own successful runs
(DSPy's BootstrapFewShot idea): `loopstack.bench.golden.bootstrap` runs a practice task set - never
the golden tasks - keeps the runs its checkers passed, and writes them to a JSON file; the agent
loads it with ``LOOPSTACK_AGENT_EXAMPLES=FILE`` and shows the examples whose tools this run offers
(at most ``limit``) before it asks for the final answer.

A file holds ``[{"question": str, "calls": [{"name", "arguments", "result"}], "answer": str}]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["load", "render"]


def load(path: str | Path) -> list[dict[str, Any]]:
    """The examples in a file (a missing or malformed file is an error the CLI reports)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(
        isinstance(e, dict) and {"question", "calls", "answer"} <= set(e) for e in data
    ):
        raise ValueError(f"{path}: not a list of {{question, calls, answer}} examples")
    return data


def render(examples: list[dict[str, Any]], tools: Iterable[str], limit: int = 3) -> str:
    """The examples whose calls all use tools of this run, as prompt text."""
    offered = set(tools)
    chosen = [e for e in examples if e["calls"] and all(c["name"] in offered for c in e["calls"])][
        :limit
    ]
    blocks = []
    for e in chosen:
        results = "\n".join(
            f"- {c['name']}({json.dumps(c['arguments'], ensure_ascii=False)}) returned: "
            f"{c['result']}"
            for c in e["calls"]
        )
        reply = json.dumps({"answer": e["answer"]}, ensure_ascii=False)
        blocks.append(f"Request: {e['question']}\nTool results:\n{results}\nReply: {reply}")
    return "\n\n".join(blocks)
