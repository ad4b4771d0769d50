"""Memory: recall before a run, write-back after it, memory tools as `Tool`s."""

from __future__ import annotations

from pathlib import Path

from loopstack.agent.protocols import MemoryLink, Tool
from loopstack.agent.run.longterm import StoreMemory
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import ScriptedModel, call, text
from loopstack.agent.tools.registry import ToolRegistry
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.tools import memory_tools


def store(tmp_path: Path) -> AsyncMemoryStore:
    settings = MemorySettings(threshold=0.2, persist_every=50)
    return AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=settings)


async def test_fact_from_one_run_is_recalled_in_the_next(tmp_path: Path) -> None:
    st = await store(tmp_path).open()
    try:
        link = StoreMemory(st, user_id="ana")
        assert isinstance(link, MemoryLink)
        model = ScriptedModel([text("noted")], answer="Noted.")
        await Agent(model.client(), "m", memory=link).run("Remember that my locker code is 4417.")
        model2 = ScriptedModel([text("4417")], answer="Your locker code is 4417.")
        await Agent(model2.client(), "m", memory=link).run("What is my locker code?")
        system = model2.requests[0]["messages"][0]["content"]
        assert "<memory>" in system and "4417" in system
        other = ScriptedModel([text("?")])
        await Agent(other.client(), "m", memory=StoreMemory(st, user_id="bob")).run(
            "What is my locker code?"
        )
        assert "4417" not in other.requests[0]["messages"][0]["content"]
    finally:
        await st.close()


async def test_memory_tools_satisfy_the_tool_protocol(tmp_path: Path) -> None:
    st = await store(tmp_path).open()
    try:
        # The host vouches that the user said it (memory trusts no model's claim of that).
        tools = memory_tools(st, user_id="ana", confirm_user_said=lambda _text: True)
        assert [t.name for t in tools] == ["recall_memory", "save_memory"]
        assert all(isinstance(t, Tool) and not t.dangerous for t in tools)
        reg = ToolRegistry(tools)
        model = ScriptedModel(
            [
                call("save_memory", text="User's favourite colour is teal", user_said_it=True),
                call("recall_memory", query="favourite colour"),
                text("teal"),
            ]
        )
        res = await Agent(model.client(), "m", reg).run("My favourite colour is teal, save it")
        assert [c["status"] for c in res.tool_calls] == ["ok", "ok"]
        recalled = [m for m in model.chat_requests[2]["messages"] if m["role"] == "tool"][-1]
        assert "teal" in recalled["content"]
    finally:
        await st.close()
