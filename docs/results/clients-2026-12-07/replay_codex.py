"""Replays Codex's captured first request (codex-request.json, written by `loopstack bench
clients --clients codex --keep-requests`) against a server, as captured and with one thing
changed per variant, and prints what the model answered (a call and to what, or text), the
server's x-loopstack-* headers and the time. Item 6 of issue 55: why Codex's `exec_command`
is never called.

    python replay_codex.py BASE_URL KEY [VARIANT ...]
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).parent
MAX_OUTPUT = 160  # a CPU box shared with other work decodes ~2 tokens/s
LS_TASK = "List the files in this folder with ls and tell me what is there."


def _task(body: dict[str, Any], text: str) -> None:
    body["input"][-1]["content"][0]["text"] = text


def _only_tools(body: dict[str, Any], names: set[str]) -> None:
    body["tools"] = [t for t in body["tools"] if t["name"] in names]


VARIANTS: dict[str, Any] = {
    "as-captured": lambda b: None,
    "required": lambda b: b.update(tool_choice="required"),
    "no-skills": lambda b: b.update(
        input=[i for i in b["input"] if "<skills_instructions>" not in json.dumps(i)]
    ),
    "ls-task": lambda b: _task(b, LS_TASK),
    "ls-task-no-skills": lambda b: (
        _task(b, LS_TASK),
        b.update(input=[i for i in b["input"] if "<skills_instructions>" not in json.dumps(i)]),
    ),
    "ls-task-required": lambda b: (_task(b, LS_TASK), b.update(tool_choice="required")),
    "ls-task-exec-only": lambda b: (_task(b, LS_TASK), _only_tools(b, {"exec_command"})),
    "ls-task-exec-only-required": lambda b: (
        _task(b, LS_TASK),
        _only_tools(b, {"exec_command"}),
        b.update(tool_choice="required"),
    ),
}


def run(base_url: str, key: str, name: str) -> dict[str, Any]:
    body = copy.deepcopy(json.loads((HERE / "codex-request.json").read_text()))
    VARIANTS[name](body)
    body["stream"] = False
    body["max_output_tokens"] = MAX_OUTPUT  # a call shows in its first tokens
    started = time.monotonic()
    r = httpx.post(
        f"{base_url}/responses", json=body, timeout=900, headers={"Authorization": f"Bearer {key}"}
    )
    out: dict[str, Any] = {
        "variant": name,
        "status": r.status_code,
        "seconds": round(time.monotonic() - started, 1),
        "headers": {k: v for k, v in r.headers.items() if k.startswith("x-loopstack-")},
    }
    if r.status_code != 200:
        out["error"] = r.text[:500]
        return out
    data = r.json()
    out["output"] = [
        {
            "type": i["type"],
            "name": i.get("name"),
            "args": (i.get("arguments") or i.get("input") or "")[:300],
        }
        if i["type"] != "message"
        else {"type": "message", "text": "".join(c.get("text", "") for c in i["content"])[:300]}
        for i in data["output"]
    ]
    out["input_tokens"] = (data.get("usage") or {}).get("input_tokens")
    out["response_status"] = data.get("status")
    out["incomplete"] = data.get("incomplete_details")
    return out


def main() -> None:
    base_url, key, *names = sys.argv[1:]
    for name in names or list(VARIANTS):
        print(json.dumps(run(base_url, key, name)), flush=True)


if __name__ == "__main__":
    main()
