"""What an MCP server is given: environment variables (stdio) and HTTP headers (streamable HTTP).

The MCP SDK starts a stdio server with only a few safe variables (HOME, PATH, SHELL, TERM,
USER, LOGNAME); a server that needs a key or a config variable gets it here, and only what is
named, never the whole host environment:

    --mcp-env KEY=VALUE          the variable, with ``${VAR}`` taken from the host environment
    --mcp-env KEY                the host's own KEY (an error when the host has none)
    --mcp-env time:KEY=VALUE     only for the server named ``time`` (without a prefix: all)
    --mcp-header 'Authorization=Bearer ${TOKEN}'     a header (``${VAR}`` from the host)

A team file's ``mcp:`` entry is a command or URL string, or an object with the same meaning::

    mcp:
      - command: python server.py          # or  url: http://127.0.0.1:3001/mcp
        name: shop                         # optional namespace
        env: [SHOP_API_KEY, SHOP_REGION=eu] # or a mapping; a null value inherits
        headers: {Authorization: "Bearer ${SHOP_TOKEN}"}
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, model_validator

from loopstack.agent.exceptions import ConfigError

if TYPE_CHECKING:  # loopstack.agent.tools.mcp loads the MCP SDK: only when a server is started
    from loopstack.agent.tools.mcp import MCPServerSpec

__all__ = ["MCPEntry", "expand", "parse_assignments", "server_spec"]

_ENV_ITEM = re.compile(r"^(?:([A-Za-z0-9_-]{1,32}):)?([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$", re.S)
_HEADER_ITEM = re.compile(r"^(?:([A-Za-z0-9_-]{1,32}):)?([A-Za-z0-9!#$%&'*+.^_`|~-]+)=(.*)$", re.S)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ALL = "*"  # the scope of an item without a server prefix


def expand(value: str, host: Mapping[str, str] | None = None, *, what: str = "value") -> str:
    """``${VAR}`` replaced by the host's VAR; a variable the host lacks is a ConfigError
    (an empty key would only fail later, less clearly, inside the server)."""
    env = os.environ if host is None else host

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in env:
            raise ConfigError(f"{what}: ${{{m.group(1)}}} is not set in the environment")
        return env[m.group(1)]

    return _VAR.sub(sub, value)


def parse_assignments(
    items: Sequence[str],
    *,
    kind: str = "env",
    host: Mapping[str, str] | None = None,
) -> dict[str, dict[str, str]]:
    """``--mcp-env`` / ``--mcp-header`` values as ``{server or "*": {key: value}}``."""
    env = os.environ if host is None else host
    out: dict[str, dict[str, str]] = {}
    pattern = _ENV_ITEM if kind == "env" else _HEADER_ITEM
    for item in items:
        m = pattern.match(item.strip())
        if m is None:
            form = "[SERVER:]KEY[=VALUE]" if kind == "env" else "[SERVER:]Name=Value"
            raise ConfigError(f"--mcp-{kind} {item!r}: expected {form}")
        scope, key, value = m.group(1) or ALL, m.group(2), m.group(3)
        if value is None:  # KEY alone: inherit that one variable from the host
            if key not in env:
                raise ConfigError(f"--mcp-env {key}: not set in this environment")
            value = env[key]
        else:
            value = expand(value, env, what=f"--mcp-{kind} {key}")
        out.setdefault(scope, {})[key] = value
    return out


def _for(server: str, scoped: Mapping[str, dict[str, str]]) -> dict[str, str]:
    return {**scoped.get(ALL, {}), **scoped.get(server, {})}


class MCPEntry(BaseModel):
    """One ``mcp:`` entry of a team file written as an object."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    url: str | None = None
    name: str | None = None
    env: list[str] | dict[str, str | None] = []
    headers: list[str] | dict[str, str] = []

    @model_validator(mode="after")
    def _one_target(self) -> MCPEntry:
        if (self.command is None) == (self.url is None):
            raise ValueError("an mcp entry needs exactly one of command or url")
        if self.url is not None and self.env:
            raise ValueError("env is for a command (stdio server); a URL takes headers")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a url (streamable HTTP); a command takes env")
        return self

    def env_items(self) -> list[str]:
        if isinstance(self.env, list):
            return list(self.env)
        return [k if v is None else f"{k}={v}" for k, v in self.env.items()]

    def header_items(self) -> list[str]:
        if isinstance(self.headers, list):
            return list(self.headers)
        return [f"{k}={v}" for k, v in self.headers.items()]

    def text(self) -> str:
        target = self.command if self.command is not None else self.url
        assert target is not None
        return f"{self.name}={target}" if self.name else target


def server_spec(
    entry: str | MCPEntry,
    *,
    timeout_s: float,
    env: Sequence[str] = (),
    headers: Sequence[str] = (),
    host: Mapping[str, str] | None = None,
) -> MCPServerSpec:
    """The spec of one server: its command or URL, the run's timeouts, and the variables and
    headers meant for it (the entry's own over the run's ``--mcp-env``/``--mcp-header``)."""
    from loopstack.agent.tools.mcp import MCPServerSpec

    if isinstance(entry, MCPEntry):
        env = [*env, *entry.env_items()]
        headers = [*headers, *entry.header_items()]
        entry = entry.text()
    spec = MCPServerSpec.parse(entry, timeout_s=timeout_s)
    env_scoped = parse_assignments(env, kind="env", host=host)
    header_scoped = parse_assignments(headers, kind="header", host=host)
    env_for, headers_for = _for(spec.name, env_scoped), _for(spec.name, header_scoped)
    if spec.url is not None:
        if spec.name in env_scoped:
            raise ConfigError(f"MCP server {spec.name}: env is for a command, not a URL")
        env_for = {}  # unscoped --mcp-env items are for the run's stdio servers
    else:
        if spec.name in header_scoped:
            raise ConfigError(f"MCP server {spec.name}: headers need a URL, not a command")
        headers_for = {}  # unscoped --mcp-header items are for the run's HTTP servers
    return replace(
        spec,
        env=env_for or None,
        headers=headers_for or None,
        startup_timeout_s=max(30.0, timeout_s),
    )
