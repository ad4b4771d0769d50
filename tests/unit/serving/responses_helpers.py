"""Helpers for the Responses API tests: request bodies, tools, and the SSE event reader."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import WEATHER

FN_WEATHER = {"type": "function", **WEATHER["function"], "strict": True}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "*** Begin Patch" LF body "*** End Patch"\nbody: /(.|\\n)*/\n'
        "%import common.LF",
    },
}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hi "there"\n*** End Patch'


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "What is the weather in Paris?", **kw}


async def create(h: Harness, **kw: Any) -> Any:
    return await h.client.post("/v1/responses", json=body(**kw))


def events(text: str) -> list[dict[str, Any]]:
    """The events of a Responses SSE body, checking each `event:` name against its type."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :], block
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def kinds(evs: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in evs]


def squash(names: list[str]) -> list[str]:
    """Runs of one delta event as a single ``<name>*`` entry."""
    out: list[str] = []
    for n in names:
        if n.endswith(".delta"):
            n += "*"
            if out and out[-1] == n:
                continue
        out.append(n)
    return out


def engine_messages(h: Harness) -> str:
    """What the chat path rendered for the engine (the last completions prompt), or the
    last chat request's messages as JSON (the pass-through)."""
    path, last = h.engine.requests[-1]
    if path == "/v1/completions":
        return str(last["prompt"])
    return json.dumps(last["messages"])
