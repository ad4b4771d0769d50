"""--mcp-env / --mcp-header parsing and team-file mcp entries (no server needed)."""

from __future__ import annotations

import pytest

from loopstack.agent.exceptions import ConfigError
from loopstack.agent.run.team import TeamConfig
from loopstack.agent.tools.mcp_config import MCPEntry, parse_assignments, server_spec

HOST = {"TOKEN": "s3cret", "REGION": "eu", "PATH": "/bin"}


def test_env_items_values_inherits_and_scopes() -> None:
    got = parse_assignments(
        ["A=1", "REGION", "B=x-${TOKEN}", "git:C=only-git", "D="], kind="env", host=HOST
    )
    assert got == {
        "*": {"A": "1", "REGION": "eu", "B": "x-s3cret", "D": ""},
        "git": {"C": "only-git"},
    }


@pytest.mark.parametrize("item", ["MISSING", "A=${MISSING}", "1BAD=x", "=x"])
def test_env_items_that_cannot_be_honoured_are_errors(item: str) -> None:
    with pytest.raises(ConfigError):
        parse_assignments([item], kind="env", host=HOST)


def test_headers_expand_variables() -> None:
    got = parse_assignments(["Authorization=Bearer ${TOKEN}"], kind="header", host=HOST)
    assert got == {"*": {"Authorization": "Bearer s3cret"}}
    with pytest.raises(ConfigError):
        parse_assignments(["Authorization"], kind="header", host=HOST)  # no value


def test_server_spec_gives_each_server_its_own() -> None:
    env = ["A=1", "time:B=2", "git:C=3"]
    spec = server_spec("mcp-server-time", timeout_s=5, env=env, host=HOST)
    assert spec.env == {"A": "1", "B": "2"} and spec.headers is None
    bare = server_spec("mcp-server-time", timeout_s=5, host=HOST)
    assert bare.env is None  # the SDK's safe default only, never the host's whole environment
    http = server_spec(
        "http://127.0.0.1:3001/mcp",
        timeout_s=5,
        env=env,
        headers=["X-Key=${TOKEN}"],
        host=HOST,
    )
    assert http.env is None and http.headers == {"X-Key": "s3cret"}
    assert http.startup_s >= 30.0
    with pytest.raises(ConfigError):  # a header aimed at a stdio server
        server_spec("mcp-server-time", timeout_s=5, headers=["time:X=1"], host=HOST)


def test_team_file_entries_take_env_and_headers() -> None:
    config = TeamConfig.model_validate(
        {
            "workers": [
                {
                    "name": "shop",
                    "description": "orders",
                    "mcp": [
                        "mcp-server-time",
                        {
                            "command": "python s.py",
                            "name": "shop",
                            "env": {"REGION": None, "K": "v"},
                        },
                        {
                            "url": "http://127.0.0.1:1/mcp",
                            "headers": {"Authorization": "Bearer ${TOKEN}"},
                        },
                    ],
                }
            ]
        }
    )
    entries = config.workers[0].mcp
    assert isinstance(entries[1], MCPEntry)
    spec = server_spec(entries[1], timeout_s=5, host=HOST)
    assert spec.name == "shop" and spec.env == {"REGION": "eu", "K": "v"}
    http = server_spec(entries[2], timeout_s=5, host=HOST)
    assert http.headers == {"Authorization": "Bearer s3cret"}
    with pytest.raises(ValueError):
        MCPEntry(url="http://x/mcp", env=["A=1"])
    with pytest.raises(ValueError):
        MCPEntry(command="a", url="http://x/mcp")
