"""Per-tool retries of transient failures: bounded attempts with exponential backoff.

A tool's failure is *transient* when trying again may well succeed: it timed out, its
connection failed (``ConnectionError``, a refused or reset socket, an HTTP client's connect or
read error), or it reported a server-side error (an HTTP 5xx: 500, 502, 503, 504). An MCP
server that died is not retried: its connection does not come back within the run. Anything
else (bad arguments, not allowed, denied, a 4xx, the tool's own exception) goes back to the
model at once, as before.

Retries are off by default (a failure is shown to the model, which may try again itself).
A policy is set per tool in the registry, by exact name or a ``fnmatch`` pattern::

    registry.retry["get_stock_price"] = RetryPolicy(attempts=3)
    registry.retry["mcp_shop__*"] = RetryPolicy(attempts=2, backoff_s=1.0)

or on the CLI with ``--retry NAME=ATTEMPTS`` (repeatable, patterns allowed). A tool marked
dangerous (an action, maybe not idempotent: a refund) is retried only under a policy that names
it exactly, never through a pattern. The attempts and the errors of the failed ones go into
the tool's trace line (``attempts``, ``retried``); retries never run past the run's clock.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from loopstack.agent.exceptions import ConfigError
from loopstack.agent.protocols import ToolResult

__all__ = ["RetryPolicy", "execute", "parse_retry", "policy_for", "transient_kind"]

logger = logging.getLogger(__name__)

Transient = Literal["timeout", "connection", "server"]
_CONNECTION = re.compile(
    r"^(ConnectionError|ConnectionRefusedError|ConnectionResetError|ConnectionAbortedError|"
    r"BrokenPipeError|ConnectError|ConnectTimeout|ReadError|ReadTimeout|RemoteProtocolError|"
    r"ServerDisconnectedError|ClientConnectorError|TimeoutError)\b"
)
_SERVER = re.compile(
    r"\b(?:HTTP|status(?: code)?|error)[ :]*5(?:0[0234])\b|"
    r"\b5(?:0[0234]) (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)\b|"
    r"\b(?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``attempts`` in all (1: no retry); wait ``backoff_s``, then ``factor`` times more each
    time, at most ``max_backoff_s``; only for the transient kinds in ``on``."""

    attempts: int = 1
    backoff_s: float = 0.5
    factor: float = 2.0
    max_backoff_s: float = 8.0
    on: frozenset[Transient] = frozenset({"timeout", "connection", "server"})

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= 10:
            raise ConfigError(f"retry attempts must be 1-10, not {self.attempts}")
        if self.backoff_s < 0 or self.factor < 1 or self.max_backoff_s < 0:
            raise ConfigError("retry backoff must be >= 0 and its factor >= 1")

    def delay(self, failed: int) -> float:
        """The wait after the ``failed``-th failed attempt (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.factor ** (failed - 1))


NO_RETRY = RetryPolicy()


def transient_kind(result: ToolResult) -> Transient | None:
    """Why a failed result is worth another attempt, or None."""
    if result.status != "error":
        return None
    err = result.error or {}
    kind, message = str(err.get("type", "")), str(err.get("message", ""))
    if kind == "timeout":
        return "timeout"
    if kind not in ("tool_error", "server_error"):
        return None  # invalid arguments, not allowed, denied, team limits: never transient
    if kind == "server_error":
        if message.startswith("MCP server "):
            return None  # the server process is gone or broken: another call cannot help
        message = message.split(": ", 1)[-1]  # "MCP shop/lookup: <what the tool said>"
    if _CONNECTION.match(message):
        return "connection"
    return "server" if _SERVER.search(message) else None


def policy_for(
    policies: Mapping[str, RetryPolicy], name: str, *, dangerous: bool = False
) -> RetryPolicy:
    """The tool's policy: its exact name first, then the first matching pattern (not for a
    dangerous tool)."""
    if name in policies:
        return policies[name]
    if dangerous:
        return NO_RETRY
    for pattern, policy in policies.items():
        if fnmatch.fnmatchcase(name, pattern):
            return policy
    return NO_RETRY


def parse_retry(items: list[str]) -> dict[str, RetryPolicy]:
    """``--retry NAME=ATTEMPTS`` values (NAME may be a pattern)."""
    out: dict[str, RetryPolicy] = {}
    for item in items:
        name, sep, n = item.partition("=")
        if not sep or not name.strip() or not n.strip().isdigit():
            raise ConfigError(f"--retry {item!r}: expected NAME=ATTEMPTS, e.g. get_price=3")
        out[name.strip()] = RetryPolicy(attempts=int(n))
    return out


async def execute(
    registry: Any,
    name: str,
    arguments: dict[str, Any],
    *,
    timeout_s: float | None,
    deadline_s: float | None = None,
) -> ToolResult:
    """``registry.execute`` under the tool's retry policy. ``deadline_s``: seconds left on the
    run's clock; no retry starts that its backoff and timeout would carry past it."""
    policies: Mapping[str, RetryPolicy] = getattr(registry, "retry", {}) or {}
    tool = registry.get(name) if name in registry else None
    policy = policy_for(policies, name, dangerous=bool(getattr(tool, "dangerous", False)))
    loop = asyncio.get_running_loop()
    started = loop.time()
    errors: list[str] = []
    attempt = 1
    while True:
        result: ToolResult = await registry.execute(name, arguments, timeout_s=timeout_s)
        why = transient_kind(result) if attempt < policy.attempts else None
        if why is None or why not in policy.on:
            break
        wait = policy.delay(attempt)
        left = None if deadline_s is None else deadline_s - (loop.time() - started)
        if left is not None and left < wait + min(timeout_s or 0.0, 1.0):
            break  # the run's clock would run out: no further attempt
        if left is not None and timeout_s is not None:
            timeout_s = min(timeout_s, left - wait)
        err = result.error or {}
        errors.append(f"{err.get('type')}: {str(err.get('message', ''))[:160]}")
        logger.info("tool %s failed (%s), attempt %d of %d", name, why, attempt, policy.attempts)
        await asyncio.sleep(wait)
        attempt += 1
    return replace(result, attempts=attempt, retried=tuple(errors)) if attempt > 1 else result
