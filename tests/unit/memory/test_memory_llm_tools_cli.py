"""Model parts (against an httpx MockTransport speaking the OpenAI API), tools and CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from typer.testing import CliRunner

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, Turn
from loopstack.memory.cli import app
from loopstack.memory.exceptions import ModelError
from loopstack.memory.llm import DISTILL_SCHEMA, ModelClient
from loopstack.memory.records import MemorySource
from loopstack.memory.tools import TOOLS, call_tool


class FakeOpenAI:
    """Answers /v1/chat/completions with canned JSON and records each request."""

    def __init__(self, replies: list[Any], status: int = 200) -> None:
        self.replies = replies
        self.status = status
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "boom"}})
        content = self.replies.pop(0)
        content = content if isinstance(content, str) else json.dumps(content)
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": content},
                    }
                ],
            },
        )


def _client(fake: FakeOpenAI) -> ModelClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    return ModelClient("http://fake/v1", model="m", http_client=http)


async def test_distill_uses_json_schema_and_validates() -> None:
    fake = FakeOpenAI(
        [
            {
                "memories": [
                    {
                        "text": "User is vegetarian",
                        "type": "preference",
                        "source": "user_explicit",
                        "confidence": 1.7,
                    },  # out of range: outlines does not enforce bounds -> clamped
                    {
                        "text": "",
                        "type": "fact",
                        "source": "task",
                        "confidence": 0.5,
                    },  # invalid: dropped
                ]
            }
        ]
    )
    client = _client(fake)
    out = await client.distill(Turn(user_message="I'm vegetarian"))
    assert [(m.text, m.confidence) for m in out] == [("User is vegetarian", 1.0)]
    rf = fake.requests[0]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == DISTILL_SCHEMA
    await client.close()


async def test_rewrite_and_errors() -> None:
    fake = FakeOpenAI([{"query": "user's home city"}, "not json"])
    client = _client(fake)
    assert await client.rewrite_query("where do I live again?") == "user's home city"
    with pytest.raises(ModelError):
        await client.rewrite_query("again")
    await client.close()
    down = _client(FakeOpenAI([], status=500))
    with pytest.raises(ModelError):
        await down.rewrite_query("x")


async def test_store_with_model_rewrites_and_distills(tmp_path: Path) -> None:
    fake = FakeOpenAI(
        [
            {
                "memories": [
                    {
                        "text": "User's home city is Porto",
                        "type": "fact",
                        "source": "user_explicit",
                        "confidence": 0.9,
                    }
                ]
            },
            {"query": "home city Porto"},
        ]
    )
    st = AsyncMemoryStore(
        tmp_path / "m.db",
        embedder=HashingEmbedder(),
        settings=MemorySettings(threshold=0.3),
        model=_client(fake),
    )
    res = await st.write_back(Turn(user_message="btw my home city is Porto"), user_id="u1")
    stored = [r for r in res if r.action == "stored"]
    assert stored and stored[0].text == "User's home city is Porto"
    rec = await st.recall("where am I from?", user_id="u1")
    assert rec.query == "home city Porto" and rec.items
    # the model never sees a secret
    fake.replies.append({"memories": []})
    await st.write_back(Turn(user_message="my password is s3cret!!"), user_id="u1")
    assert "s3cret" not in json.dumps(fake.requests[-1])
    await st.close()


def test_tool_definitions_are_valid_schemas() -> None:
    names = {t["function"]["name"] for t in TOOLS}
    assert names == {"recall_memory", "save_memory"}
    for t in TOOLS:
        jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
        assert len(t["function"]["description"]) > 80


async def test_tool_calls(store: AsyncMemoryStore) -> None:
    out = await call_tool(store, "save_memory", {"text": "User deploys with Ansible"}, user_id="u1")
    assert out.startswith("saved as mem_") and "low weight" in out
    rid = out.split()[2]
    assert (await store.get(rid, user_id="u1")).source == MemorySource.TASK
    claim = json.dumps({"text": "User's team uses Terraform", "user_said_it": True})
    # The model's claim alone does not make it the user's words (host confirmation is off).
    out = await call_tool(store, "save_memory", claim, user_id="u1")
    assert "not confirmed by the host" in out
    rid = out.split()[2]
    assert (await store.get(rid, user_id="u1")).source == MemorySource.TASK
    asked: list[str] = []

    async def confirm(text: str) -> bool:
        asked.append(text)
        return True

    out = await call_tool(store, "save_memory", claim, user_id="u1", confirm_user_said=confirm)
    assert "low weight" not in out and asked == ["User's team uses Terraform"]
    rec = await store.get(out.split()[2], user_id="u1")
    assert rec.id == rid and [e.kind for e in rec.events] == ["confirmed"]  # same claim, now
    out = await call_tool(  # a sync callback that says no
        store,
        "save_memory",
        {"text": "User is an admin", "user_said_it": True},
        user_id="u1",
        confirm_user_said=lambda _t: False,
    )
    assert "not confirmed" in out
    got = await call_tool(store, "recall_memory", '{"query": "Terraform team"}', user_id="u1")
    assert "Terraform" in got and got.startswith("<memory>")
    assert (await call_tool(store, "recall_memory", {"query": "Terraform"}, user_id="u2")) == (
        "No relevant memories."
    )
    bad = await call_tool(store, "recall_memory", {"query": ""}, user_id="u1")
    assert bad.startswith("error: invalid arguments")
    assert (await call_tool(store, "nope", {}, user_id="u1")).startswith("error: unknown")


def test_cli_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSTACK_MEMORY_EMBEDDER", "hashing")
    monkeypatch.setenv("LOOPSTACK_MEMORY_THRESHOLD", "0.3")
    db = str(tmp_path / "cli.db")
    run = CliRunner()

    def ok(*args: str) -> str:
        r = run.invoke(app, [*args, "--db", db])
        assert r.exit_code == 0, r.output
        return r.output

    rid = ok("add", "The build server is called hopper", "-u", "alice").strip()
    ok("add", "Alice prefers short answers", "-u", "alice", "-t", "preference")
    out = ok("search", "what is the build server called", "-u", "alice", "--explain")
    assert "hopper" in out and "<memory>" in out
    assert "hopper" not in ok("search", "build server", "-u", "bob")
    listed = json.loads(ok("list", "-u", "alice", "--json"))
    assert {r["id"] for r in listed} >= {rid}
    new = ok("add", "The build server is called turing", "-u", "alice").strip()
    chain = json.loads(ok("history", new, "-u", "alice", "--json"))
    assert [c["id"] for c in chain] == [rid, new]
    assert json.loads(ok("reindex"))["vectors"] == 2
    assert json.loads(ok("stats"))["active"] == 2
    r = run.invoke(app, ["forget", rid, "-u", "bob", "--db", db])
    assert r.exit_code == 1 and "error" in r.output
    assert "deleted 2" in ok("forget", new, "-u", "alice")
    assert "deleted 1" in ok("forget", "-u", "alice", "--match", "prefers short answers")
    stats = json.loads(ok("stats"))  # forgotten records stay as tombstones (issue #44)
    assert (stats["active"], stats["forgotten"], stats["records"]) == (0, 3, 3)
