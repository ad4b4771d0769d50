"""Per-tool retries of transient tool failures (loopstack.agent.tools.retry), in the registry and
the loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loopstack.agent.core.settings import AgentConfig, Limits
from loopstack.agent.core.state import ToolStep
from loopstack.agent.exceptions import ConfigError
from loopstack.agent.observe.trace import load_trace
from loopstack.agent.protocols import ToolResult
from loopstack.agent.run.loop import Agent
from loopstack.agent.scripted import ScriptedModel, call
from loopstack.agent.tools import retry
from loopstack.agent.tools.registry import FunctionTool, ToolRegistry
from loopstack.agent.tools.retry import RetryPolicy, parse_retry, policy_for, transient_kind


def err(kind: str, message: str) -> ToolResult:
    return ToolResult("error", error={"type": kind, "message": message})


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        (err("timeout", "quote ran past its 5 s timeout"), "timeout"),
        (err("tool_error", "ConnectionError: market data unavailable (HTTP 503)"), "connection"),
        (err("tool_error", "ConnectionResetError: [Errno 104] reset by peer"), "connection"),
        (err("tool_error", "RuntimeError: upstream said HTTP 502 Bad Gateway"), "server"),
        (err("tool_error", "HTTPStatusError: Server error '503 Service Unavailable'"), "server"),
        (err("server_error", "MCP shop/lookup: ConnectionError: upstream reset"), "connection"),
        (err("server_error", "MCP shop/lookup: HTTP 504 from the backend"), "server"),
        # not transient: the model (or the user) must change something
        (err("tool_error", "ValueError: unknown order id"), None),
        (err("tool_error", "HTTPStatusError: Client error '404 Not Found'"), None),
        (err("server_error", "MCP shop/lookup: order A9 does not exist"), None),
        (err("server_error", "MCP server shop: connection closed (stderr: boom)"), None),
        (err("invalid_arguments", "order_id: required"), None),
        (err("denied", "call not approved (dangerous)"), None),
        (err("not_allowed", "tool 'x' is not available"), None),
        (ToolResult("ok", data={"status": 503}), None),
    ],
)
def test_transient_kinds(result: ToolResult, kind: str | None) -> None:
    assert transient_kind(result) == kind


def test_policies_by_name_and_pattern_and_never_a_dangerous_tool_by_pattern() -> None:
    three, two = RetryPolicy(attempts=3), RetryPolicy(attempts=2)
    policies = {"get_price": three, "shop__*": two}
    assert policy_for(policies, "get_price") is three
    assert policy_for(policies, "shop__lookup") is two
    assert policy_for(policies, "shop__refund", dangerous=True).attempts == 1
    assert policy_for({"shop__refund": two}, "shop__refund", dangerous=True) is two
    assert policy_for(policies, "other").attempts == 1
    assert parse_retry(["get_price=3", "shop__*=2"]) == {"get_price": three, "shop__*": two}
    for bad in ["get_price", "=3", "x=many", "x=0", "x=11"]:
        with pytest.raises(ConfigError):
            parse_retry([bad])
    assert [RetryPolicy(backoff_s=1, factor=2, max_backoff_s=3).delay(n) for n in (1, 2, 3)] == [
        1,
        2,
        3,
    ]


class Flaky:
    """A ``quote`` tool that fails ``failures`` times with ``exc``, then answers."""

    def __init__(self, failures: int, exc: Exception) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

        def quote(symbol: str) -> dict[str, Any]:
            """A stock quote.

            Args:
                symbol: the ticker
            """
            self.calls += 1
            if self.calls <= self.failures:
                raise self.exc
            return {"symbol": symbol, "price": 12.5}

        self.fn = quote


def registry_with(fn: Flaky, **policies: RetryPolicy) -> ToolRegistry:
    reg = ToolRegistry([FunctionTool(fn.fn)])
    reg.retry.update(policies)
    return reg


async def test_transient_failures_are_retried_with_backoff_and_counted() -> None:
    fn = Flaky(2, ConnectionError("HTTP 503"))
    reg = registry_with(fn, quote=RetryPolicy(attempts=3, backoff_s=0.01))
    res = await retry.execute(reg, "quote", {"symbol": "ACME"}, timeout_s=5)
    assert res.status == "ok" and res.data["price"] == 12.5
    assert (res.attempts, fn.calls, len(res.retried)) == (3, 3, 2)
    assert res.retried[0].startswith("tool_error: ConnectionError")


async def test_bounded_and_off_by_default_and_not_for_permanent_errors() -> None:
    fn = Flaky(10, ConnectionError("down"))
    res = await retry.execute(
        registry_with(fn, quote=RetryPolicy(attempts=2, backoff_s=0)),
        "quote",
        {"symbol": "A"},
        timeout_s=5,
    )
    assert res.status == "error" and res.attempts == 2 and fn.calls == 2
    off = Flaky(1, ConnectionError("down"))
    res = await retry.execute(registry_with(off), "quote", {"symbol": "A"}, timeout_s=5)
    assert res.status == "error" and res.attempts == 1 and off.calls == 1
    bad = Flaky(1, ValueError("unknown symbol"))
    res = await retry.execute(
        registry_with(bad, quote=RetryPolicy(attempts=3, backoff_s=0)),
        "quote",
        {"symbol": "A"},
        timeout_s=5,
    )
    assert res.status == "error" and res.attempts == 1 and bad.calls == 1


async def test_retries_never_run_past_the_runs_clock() -> None:
    fn = Flaky(5, ConnectionError("down"))
    reg = registry_with(fn, quote=RetryPolicy(attempts=5, backoff_s=2.0))
    t0 = asyncio.get_running_loop().time()
    res = await retry.execute(reg, "quote", {"symbol": "A"}, timeout_s=5, deadline_s=1.0)
    assert res.attempts == 1 and asyncio.get_running_loop().time() - t0 < 0.5


async def test_the_loop_shows_attempts_in_the_trace() -> None:
    fn = Flaky(1, TimeoutError())
    reg = registry_with(fn, quote=RetryPolicy(attempts=2, backoff_s=0.01))
    model = ScriptedModel([call("quote", symbol="ACME")], answer="12.5")
    agent = Agent(model.client(), "m", reg, AgentConfig(limits=Limits(repeat_nudges=0)))
    res = await agent.run("Price of ACME?")
    step = next(s for s in res.history if isinstance(s, ToolStep))
    assert step.status == "ok" and step.attempts == 2 and fn.calls == 2
    line = next(x for x in load_trace(res.trace_path) if x["type"] == "tool")
    assert line["attempts"] == 2 and line["retried"][0].startswith("timeout: ")
