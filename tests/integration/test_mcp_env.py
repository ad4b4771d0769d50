"""MCP servers get their environment and auth (no model needed): a real server built with the
official SDK (`mcp_fixtures/keyed_server.py`) that lists no tools without FIXTURE_API_KEY, and
over streamable HTTP answers 401 without its bearer token.

Without `--mcp-env` it lists nothing and a WARNING carries its stderr; with it, the tools are
there, and only the variables named reach the server process."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from loopstack.agent.cli import build_agent
from loopstack.agent.exceptions import ToolServerError
from loopstack.agent.tools.mcp import MCPToolServer
from loopstack.agent.tools.mcp_config import server_spec
from tests.mcp_http import mcp_http_server

KEYED = str(Path(__file__).parent / "mcp_fixtures" / "keyed_server.py")
COMMAND = f"keyed={sys.executable} {KEYED} stdio"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIXTURE_REGION", "eu-north")
    monkeypatch.setenv("FIXTURE_SECRET_NOT_PASSED", "must-stay-here")
    monkeypatch.setenv("MY_SHOP_KEY", "k-123")
    monkeypatch.delenv("FIXTURE_API_KEY", raising=False)


async def test_without_its_variable_the_server_lists_nothing_and_we_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = server_spec(COMMAND, timeout_s=10)
    assert spec.env is None  # nothing of the host environment unless named
    with caplog.at_level(logging.WARNING, logger="loopstack.agent.tools.mcp"):
        async with MCPToolServer(spec) as server:
            assert server.tools == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "keyed lists no tools" in w and "FIXTURE_API_KEY is not set" in w for w in warnings
    ), warnings


async def test_mcp_env_gives_the_key_and_only_the_named_variables() -> None:
    spec = server_spec(
        COMMAND,
        timeout_s=10,
        env=["FIXTURE_API_KEY=${MY_SHOP_KEY}", "FIXTURE_REGION", "other:IGNORED=1"],
    )
    async with MCPToolServer(spec) as server:
        tools = {t.name: t for t in server.tools}
        assert {"keyed__whoami", "keyed__lookup"} <= set(tools)
        seen = await tools["keyed__whoami"].call({})
    assert seen["sees"] == ["FIXTURE_API_KEY", "FIXTURE_REGION"]  # not the unnamed secret
    assert seen["region"] == "eu-north"
    import hashlib

    assert seen["key_sha1"] == hashlib.sha1(b"k-123").hexdigest()[:8]


async def test_the_cli_passes_mcp_env_to_its_servers() -> None:
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
    async with build_agent(
        tools=[],
        mcp=[COMMAND],
        mcp_env=["keyed:FIXTURE_API_KEY=abc"],
        user="u",
        memory=False,
        base_url=None,
        model="m",
        allow=None,
        approve_dangerous=False,
        overrides={},
        client=client,
    ) as agent:
        assert "keyed__lookup" in agent.tools.names()
    await client.close()


@pytest.fixture(scope="module")
def keyed_http() -> Iterator[str]:
    env = {**os.environ, "FIXTURE_API_KEY": "k", "FIXTURE_TOKEN": "t0k-secret"}
    with mcp_http_server(KEYED, env) as (url, _):
        yield url


async def test_http_headers_carry_a_bearer_token_from_the_environment(
    keyed_http: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ToolServerError):  # 401 without the token
        async with MCPToolServer(server_spec(f"kh={keyed_http}", timeout_s=5)):
            pass
    monkeypatch.setenv("SHOP_TOKEN", "t0k-secret")
    spec = server_spec(
        f"kh={keyed_http}", timeout_s=5, headers=["Authorization=Bearer ${SHOP_TOKEN}"]
    )
    assert spec.headers == {"Authorization": "Bearer t0k-secret"}
    async with MCPToolServer(spec) as server:
        tools = {t.name: t for t in server.tools}
        assert await tools["kh__lookup"].call({"order_id": "A1"}) == {
            "order_id": "A1",
            "status": "shipped",
        }


async def test_a_team_file_entry_gives_its_server_its_env(tmp_path: Path) -> None:
    from contextlib import AsyncExitStack

    from loopstack.agent.core.settings import Limits
    from loopstack.agent.run.team import load_team, mount_team

    team = tmp_path / "team.yaml"
    team.write_text(
        "workers:\n"
        "  - name: shop\n"
        "    description: Looks orders up.\n"
        "    mcp:\n"
        f"      - command: {sys.executable} {KEYED} stdio\n"
        "        name: keyed\n"
        "        env: ['FIXTURE_API_KEY=${MY_SHOP_KEY}', FIXTURE_REGION]\n"
    )
    async with AsyncExitStack() as stack:
        workers = await mount_team(load_team(team), tmp_path, stack, Limits())
        tool = workers[0].tools.get("keyed__whoami")
        seen = await tool.call({})
    assert seen["sees"] == ["FIXTURE_API_KEY", "FIXTURE_REGION"]
