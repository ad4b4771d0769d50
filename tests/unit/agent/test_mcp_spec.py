"""MCPServerSpec.parse, tool namespacing and result unpacking (no server needed)."""

from __future__ import annotations

import re

import pytest
from mcp import types as mcp_types

from loopstack.agent.exceptions import ConfigError
from loopstack.agent.tools.mcp import MCPServerSpec, result_value, tool_name

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.mark.parametrize(
    ("text", "name", "command"),
    [
        (
            "mcp-server-time --local-timezone UTC",
            "time",
            ["mcp-server-time", "--local-timezone", "UTC"],
        ),
        (
            "uvx mcp-server-git --repository /tmp/r",
            "git",
            ["uvx", "mcp-server-git", "--repository", "/tmp/r"],
        ),
        ("python -m mcp_server_time", "time", ["python", "-m", "mcp_server_time"]),
        ("npx -y @modelcontextprotocol/server-everything", "everything", None),
        ("node ./weather-mcp.js --x 1", "weather", None),
        ("clock=mcp-server-time", "clock", ["mcp-server-time"]),
        (
            "  repo=mcp-server-git --repository '/a b'  ",
            "repo",
            ["mcp-server-git", "--repository", "/a b"],
        ),
    ],
)
def test_parse_stdio(text: str, name: str, command: list[str] | None) -> None:
    spec = MCPServerSpec.parse(text)
    assert spec.name == name
    assert spec.url is None
    assert spec.command
    if command is not None:
        assert spec.command == command


@pytest.mark.parametrize(
    ("text", "name", "url"),
    [
        ("http://127.0.0.1:3001/mcp", "127-0-0-1-3001", "http://127.0.0.1:3001/mcp"),
        ("https://tools.example.com/mcp", "tools-example-com", "https://tools.example.com/mcp"),
        ("docs=http://localhost:9000/mcp", "docs", "http://localhost:9000/mcp"),
    ],
)
def test_parse_http(text: str, name: str, url: str) -> None:
    spec = MCPServerSpec.parse(text, timeout_s=5)
    assert (spec.name, spec.url, spec.command, spec.timeout_s) == (name, url, None, 5)


@pytest.mark.parametrize(
    "text", ["", "   ", "http://x/mcp extra", "a__b=mcp-server-time", "cmd 'unclosed"]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        MCPServerSpec.parse(text)


def test_spec_needs_exactly_one_transport() -> None:
    with pytest.raises(ConfigError):
        MCPServerSpec(name="x")
    with pytest.raises(ConfigError):
        MCPServerSpec(name="x", command=["a"], url="http://h/mcp")
    with pytest.raises(ConfigError):
        MCPServerSpec(name="x", command=["a"], timeout_s=0)


@pytest.mark.parametrize(
    ("server", "tool"),
    [
        ("time", "get_current_time"),
        ("git", "git.status"),
        ("srv", "a very/odd name!"),
        ("s" * 32, "t" * 80),
        ("x", "__dunder__"),
    ],
)
def test_tool_names_are_openai_names(server: str, tool: str) -> None:
    name = tool_name(server, tool)
    assert OPENAI_NAME.match(name), name
    assert name.startswith(server + "__")
    assert "__" not in name[len(server) + 2 :]


def test_long_tool_names_stay_distinct() -> None:
    assert tool_name("s", "t" * 80 + "a") != tool_name("s", "t" * 80 + "b")


def test_result_value_prefers_structured_content() -> None:
    text = mcp_types.TextContent(type="text", text='{"sum": 5}')
    structured = mcp_types.CallToolResult(content=[text], structured_content={"sum": 5})
    assert result_value(structured) == {"sum": 5}
    plain = mcp_types.CallToolResult(content=[text])
    assert result_value(plain) == '{"sum": 5}'
    two = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="a"),
            mcp_types.TextContent(type="text", text="b"),
        ]
    )
    assert result_value(two) == "a\nb"
    assert result_value(mcp_types.CallToolResult(content=[])) == ""
