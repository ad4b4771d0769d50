"""Our endpoint as a drop-in for runtimes people already use: the OpenAI Agents SDK
(`OpenAIChatCompletionsModel` over an `AsyncOpenAI` client on our base URL) and LangChain's
`ChatOpenAI` with bound tools, `auto` and named. Their tool calls must arrive schema-valid."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": WEATHER_SCHEMA,
    },
}


async def test_openai_agents_sdk_runs_a_function_tool(server: Server) -> None:
    ran: list[dict[str, Any]] = []

    @function_tool
    def add_numbers(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First number.
            b: Second number.
        """
        ran.append({"a": a, "b": b})
        return a + b

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="adder",
        instructions="Use the add_numbers tool to add numbers, then reply with the result.",
        tools=[add_numbers],
        model=OpenAIChatCompletionsModel(model=server.model, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0),
    )
    # tool_choice="required" makes every turn a call; this small model also keeps calling
    # after the result, so the run may end at max_turns: what matters is the call itself.
    try:
        result = await Runner.run(agent, "What is 17 plus 25?", max_turns=2)
        final: Any = result.final_output
    except MaxTurnsExceeded:
        final = None
    assert ran, "the tool never ran"
    schema = add_numbers.params_json_schema
    for args in ran:
        jsonschema.validate(args, schema)
        assert all(isinstance(v, int) for v in args.values())
    assert final is None or isinstance(final, str)


@pytest.mark.parametrize("mode", ["auto", "named"])
def test_langchain_chat_openai_bound_tools(server: Server, mode: str) -> None:
    llm = ChatOpenAI(
        model=server.model,
        base_url=server.base_url + "/v1",
        api_key=API_KEY,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=64,  # type: ignore[call-arg]
        max_retries=0,
        timeout=240,
    )
    choice: Any = "auto" if mode == "auto" else "get_weather"
    bound = llm.bind_tools([WEATHER_TOOL], tool_choice=choice)
    message = bound.invoke("What is the weather in Paris in celsius? Call the get_weather tool.")
    calls = message.tool_calls  # type: ignore[attr-defined]
    assert calls, f"no tool call in {mode} mode: {message.content!r}"
    assert not message.invalid_tool_calls  # type: ignore[attr-defined]
    for call in calls:
        assert call["name"] == "get_weather"
        jsonschema.validate(call["args"], WEATHER_SCHEMA)
    assert convert_to_openai_tool(WEATHER_TOOL)["function"]["parameters"] == WEATHER_SCHEMA
