"""Agent frameworks as a user runs them against our server: the OpenAI Agents SDK and
LangChain, from their own venv (.venv-clients, `make clients`), never the server's.

Run with that venv's python; the server is found as any OpenAI client finds it, through
OPENAI_BASE_URL (".../v1") and OPENAI_API_KEY. Each command prints one JSON object on stdout
(what the framework returned, and what the tools really returned) for
tests/integration/test_ecosystem.py to judge:

    python tests/clients/frameworks.py agents-tools MODEL
    python tests/clients/frameworks.py agents-mcp MODEL MCP_SERVER_TIME_COMMAND
    python tests/clients/frameworks.py langchain-tools MODEL auto|named
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from importlib.metadata import version
from typing import Any, Literal

# Each model turn may take a while on a CPU server that other tests share.
TIMEOUT_S = 240.0


def _agents_setup() -> Any:
    from agents import set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # traces would go to api.openai.com with our key
    return AsyncOpenAI(max_retries=0, timeout=TIMEOUT_S)


def _run_items(result: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """The tool calls the model made (name, arguments as sent) and the tools' outputs."""
    from agents.items import ToolCallItem, ToolCallOutputItem

    calls, outputs = [], []
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            name = getattr(raw, "name", None) or (
                raw.get("name") if isinstance(raw, dict) else None
            )
            args = getattr(raw, "arguments", None)
            if args is None and isinstance(raw, dict):
                args = raw.get("arguments")
            calls.append({"name": name, "arguments": args})
        elif isinstance(item, ToolCallOutputItem):
            outputs.append(item.output)
    return calls, outputs


# Said as the user once every tool has run (see _once_each).
ANSWER_NOW = "Now answer my question in one sentence, using the tool results."


def _once_each(tools: set[str]) -> Any:
    """Run hooks that offer each of `tools` until it has run once (`is_enabled` for function
    tools, a dynamic `tool_filter` for MCP ones); once all have run, the model is called
    without tools and with one more user line, ANSWER_NOW (`RunConfig.call_model_input_filter`).

    Without them the default 0.5B model fails both ways (temperature 0): offered a tool whose
    result it already has, it calls it again on every turn (5 of 5 turns in 2 of 2 runs, the
    same through the plain `openai` client with four different system prompts), and called
    without tools right after the results, it repeats its last call as text (2 of 2 runs)."""
    from agents import RunHooks
    from agents.run_config import CallModelData, ModelInputData

    class OnceEach(RunHooks[Any]):
        def __init__(self) -> None:
            self.used: set[str] = set()

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
            self.used.add(tool.name)

        def enabled(self, name: str) -> Any:
            return lambda ctx, agent: name not in self.used

        def mcp_filter(self) -> Any:
            return lambda ctx, tool: tool.name in tools and tool.name not in self.used

        def input_filter(self, data: CallModelData[Any]) -> ModelInputData:
            given = data.model_data
            if not tools <= self.used:
                return given
            ask: Any = {"role": "user", "content": ANSWER_NOW}
            return ModelInputData(input=[*given.input, ask], instructions=given.instructions)

    return OnceEach()


async def _run(agent: Any, question: str, max_turns: int, hooks: Any) -> dict[str, Any]:
    from agents import RunConfig, Runner
    from agents.exceptions import MaxTurnsExceeded

    config = RunConfig(call_model_input_filter=hooks.input_filter)
    try:
        result = await Runner.run(
            agent, question, max_turns=max_turns, hooks=hooks, run_config=config
        )
    except MaxTurnsExceeded as exc:  # reported, not hidden: the test fails on it
        data = exc.run_data
        calls, outputs = _run_items(data) if data is not None else ([], [])
        return {"final_output": None, "error": f"MaxTurnsExceeded: {exc}", "calls": calls,
                "outputs": outputs}  # fmt: skip
    calls, outputs = _run_items(result)
    return {"final_output": result.final_output, "calls": calls, "outputs": outputs}


async def agents_tools(model: str) -> dict[str, Any]:
    """Two function tools, each returning a value drawn for this run: the final answer can
    only hold both values if it was written from the tool results."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, function_tool

    rng = random.SystemRandom()
    temperature, humidity = rng.randint(11, 29), rng.randint(41, 89)
    ran: list[dict[str, Any]] = []
    hooks = _once_each({"get_temperature", "get_humidity"})

    @function_tool(is_enabled=hooks.enabled("get_temperature"))
    def get_temperature(city: str) -> str:
        """The current air temperature in a city, in degrees Celsius.

        Args:
            city: City name, e.g. Paris.
        """
        ran.append({"tool": "get_temperature", "city": city})
        return f"The temperature in {city} is {temperature} degrees Celsius."

    @function_tool(is_enabled=hooks.enabled("get_humidity"))
    def get_humidity(city: str) -> str:
        """The current relative humidity in a city, in percent.

        Args:
            city: City name, e.g. Paris.
        """
        ran.append({"tool": "get_humidity", "city": city})
        return f"The humidity in {city} is {humidity} percent."

    agent = Agent(
        name="weather",
        tools=[get_temperature, get_humidity],
        model=OpenAIChatCompletionsModel(model=model, openai_client=_agents_setup()),
        model_settings=ModelSettings(temperature=0, max_tokens=96),
    )
    out = await _run(agent, "What are the temperature and the humidity in Paris now?", 5, hooks)
    return {**out, "ran": ran, "returned": {"temperature": temperature, "humidity": humidity}}


async def agents_mcp(model: str, command: str) -> dict[str, Any]:
    """mcp-server-time over stdio (`MCPServerStdio`): its tools listed and called by the SDK."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel
    from agents.mcp import MCPServerStdio

    params: Any = {"command": command, "args": ["--local-timezone", "UTC"]}
    hooks = _once_each({"get_current_time"})
    async with MCPServerStdio(
        params,
        name="time",
        cache_tools_list=True,
        client_session_timeout_seconds=60,
        tool_filter=hooks.mcp_filter(),
    ) as server:
        tools = [t.name for t in (await server.session.list_tools()).tools]  # unfiltered
        agent = Agent(
            name="clock",
            mcp_servers=[server],
            model=OpenAIChatCompletionsModel(model=model, openai_client=_agents_setup()),
            model_settings=ModelSettings(temperature=0, max_tokens=96),
        )
        out = await _run(agent, "What time is it now in Tokyo (timezone Asia/Tokyo)?", 4, hooks)
    return {**out, "mcp_tools": tools}


def langchain_tools(model: str, mode: Literal["auto", "named"]) -> dict[str, Any]:
    """LangChain 1.x: `init_chat_model` (a `ChatOpenAI`) with a pydantic tool bound, the tool
    chosen by the model (auto) or named."""
    from langchain.chat_models import init_chat_model
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        """Current weather in a city."""

        city: str = Field(description="City name")
        unit: Literal["celsius", "fahrenheit"]

    llm = init_chat_model(
        model,
        model_provider="openai",
        base_url=os.environ["OPENAI_BASE_URL"],
        temperature=0,
        max_tokens=64,
        max_retries=0,
        timeout=TIMEOUT_S,
    )
    choice = "auto" if mode == "auto" else "GetWeather"
    message: Any = llm.bind_tools([GetWeather], tool_choice=choice).invoke(
        "What is the weather in Paris in celsius?"
    )
    return {
        "chat_model": type(llm).__name__,
        "schema": convert_to_openai_tool(GetWeather)["function"]["parameters"],
        "content": message.content,
        "tool_calls": message.tool_calls,
        "invalid_tool_calls": message.invalid_tool_calls,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("agents-tools").add_argument("model")
    mcp = sub.add_parser("agents-mcp")
    mcp.add_argument("model")
    mcp.add_argument("server_command")
    lc = sub.add_parser("langchain-tools")
    lc.add_argument("model")
    lc.add_argument("mode", choices=["auto", "named"])
    args = parser.parse_args(argv)
    if args.command == "agents-tools":
        out = asyncio.run(agents_tools(args.model))
    elif args.command == "agents-mcp":
        out = asyncio.run(agents_mcp(args.model, args.server_command))
    else:
        out = langchain_tools(args.model, args.mode)
    packages = ("openai-agents", "langchain", "langchain-openai", "openai")
    out["versions"] = {p: version(p) for p in packages}
    json.dump(out, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
