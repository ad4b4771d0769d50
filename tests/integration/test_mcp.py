"""MCP tools from real servers, no model needed: `mcp-server-time` and `mcp-server-git` (PyPI)
over stdio, and a server built with the official SDK (`MCPServer`) over stdio and streamable
HTTP. Failures (crash mid-call, hang, garbage, server gone) must come back as structured errors
within the timeout, and no server process may outlive its `async with`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from loopstack.agent.exceptions import ToolServerError, ToolTimeout
from loopstack.agent.protocols import Tool
from loopstack.agent.tools.mcp import MCPServerSpec, MCPToolServer
from tests.mcp_http import mcp_http_server

FIXTURE = str(Path(__file__).parent / "mcp_fixtures" / "server.py")
STARTUP_S = 30.0  # a loaded 2-core machine takes seconds to import a Python server
pytestmark = pytest.mark.timeout(90)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != "zombie"}


@contextlib.asynccontextmanager
async def mounted(spec: MCPServerSpec) -> AsyncIterator[dict[str, Tool]]:
    before = children()
    async with MCPToolServer(spec) as server:
        assert server.tools
        yield {t.name: t for t in server.tools}
    assert children() - before == set(), "an MCP server process outlived its context"


def fixture_spec(timeout_s: float = 3.0) -> MCPServerSpec:
    return MCPServerSpec(
        name="fx",
        command=[sys.executable, FIXTURE, "stdio"],
        timeout_s=timeout_s,
        startup_timeout_s=STARTUP_S,
    )


async def test_time_server_over_stdio() -> None:
    spec = MCPServerSpec.parse("mcp-server-time --local-timezone UTC")
    async with mounted(spec) as tools:
        assert {"time__get_current_time", "time__convert_time"} <= set(tools)
        for tool in tools.values():
            assert isinstance(tool, Tool)
            assert tool.parameters["type"] == "object"
        now = await tools["time__get_current_time"].call({"timezone": "Asia/Tokyo"})
        assert now["timezone"] == "Asia/Tokyo" and now["datetime"].endswith("+09:00")
        converted = await tools["time__convert_time"].call(
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "America/New_York"}
        )
        assert converted["target"]["datetime"][11:16] in {"07:00", "08:00"}
        with pytest.raises(ToolServerError):  # the server reports a bad zone with isError
            await tools["time__get_current_time"].call({"timezone": "Mars/Olympus"})


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("first line\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "add the notes"], check=True)
    (repo / "notes.txt").write_text("first line\nsecond line\n")
    return repo


async def test_git_server_over_stdio(git_repo: Path) -> None:
    repo = git_repo
    spec = MCPServerSpec.parse(f"mcp-server-git --repository {repo}")
    assert spec.name == "git"
    async with mounted(spec) as tools:
        assert {"git__git_status", "git__git_log", "git__git_diff_unstaged"} <= set(tools)
        status = await tools["git__git_status"].call({"repo_path": str(repo)})
        assert "notes.txt" in str(status)
        log = await tools["git__git_log"].call({"repo_path": str(repo), "max_count": 5})
        assert "add the notes" in str(log)
        diff = await tools["git__git_diff_unstaged"].call({"repo_path": str(repo)})
        assert "+second line" in str(diff)


async def test_sdk_server_calls_and_structured_errors() -> None:
    async with mounted(fixture_spec()) as tools:
        assert set(tools) == {"fx__add", "fx__crash", "fx__echo", "fx__fail", "fx__sleep"}
        assert tools["fx__add"].parameters["required"] == ["a", "b"]
        assert await tools["fx__add"].call({"a": 2, "b": 40}) == {"sum": 42}
        results = await asyncio.gather(*(tools["fx__add"].call({"a": i, "b": i}) for i in range(5)))
        assert [r["sum"] for r in results] == [0, 2, 4, 6, 8]
        with pytest.raises(ToolServerError):
            await tools["fx__fail"].call({"reason": "boom"})
        started = time.monotonic()
        with pytest.raises(ToolTimeout):  # a hanging tool
            await tools["fx__sleep"].call({"seconds": 60})
        assert time.monotonic() - started < 3.0 + 1.0
        assert await tools["fx__echo"].call({"text": "still alive"}) == {"result": "still alive"}
        started = time.monotonic()
        with pytest.raises(ToolServerError):  # the server process exits inside the tool
            await tools["fx__crash"].call({})
        assert time.monotonic() - started < 3.0


async def test_server_killed_mid_call_gives_server_error_and_no_leftover() -> None:
    before = children()
    async with MCPToolServer(fixture_spec(timeout_s=5)) as server:
        tools = {t.name: t for t in server.tools}
        (pid,) = server.pids
        call = asyncio.ensure_future(tools["fx__sleep"].call({"seconds": 60}))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ToolServerError):
            await call
        assert time.monotonic() - started < 5.0
        with pytest.raises(ToolServerError):  # later calls fail fast too
            await tools["fx__echo"].call({"text": "x"})
    assert children() - before == set()


async def test_garbage_and_missing_servers_fail_at_startup() -> None:
    before = children()
    garbage = MCPServerSpec(
        name="g", command=[sys.executable, FIXTURE, "garbage"], startup_timeout_s=STARTUP_S
    )
    started = time.monotonic()
    with pytest.raises(ToolServerError, match="invalid message"):  # fails fast, not at timeout
        async with MCPToolServer(garbage):
            pass
    assert time.monotonic() - started < STARTUP_S / 2
    with pytest.raises(ToolServerError, match="No such file"):
        async with MCPToolServer(MCPServerSpec(name="n", command=["no-such-mcp-server-xyz"])):
            pass
    silent = MCPServerSpec(
        name="s", command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1
    )
    with pytest.raises(ToolTimeout):  # a server that never answers initialize
        async with MCPToolServer(silent):
            pass
    assert children() - before == set()


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with mcp_http_server(FIXTURE) as served:
        yield served


async def test_sdk_server_over_streamable_http(
    http_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = http_server
    spec = MCPServerSpec(name="fxh", url=url, timeout_s=3, startup_timeout_s=STARTUP_S)
    async with MCPToolServer(spec) as server:
        tools = {t.name: t for t in server.tools}
        assert "fxh__add" in tools and server.pids == set()
        assert await tools["fxh__add"].call({"a": 20, "b": 22}) == {"sum": 42}
        with pytest.raises(ToolTimeout):
            await tools["fxh__sleep"].call({"seconds": 30})
        call = asyncio.ensure_future(tools["fxh__sleep"].call({"seconds": 30}))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)  # the server dies mid-call
        with pytest.raises((ToolServerError, ToolTimeout)):
            await call
        assert time.monotonic() - started < 3.0 + 0.5
    with pytest.raises(ToolServerError):  # nothing listens any more
        async with MCPToolServer(spec):
            pass
