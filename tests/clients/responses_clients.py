"""The Responses API as its real clients use it: the openai SDK (``responses.create``,
``responses.stream``, ``responses.parse``, retrieve/delete, ``previous_response_id``) and the
Agents SDK with its default model class (`OpenAIResponsesModel`: ``Runner.run`` and
``Runner.run_streamed`` with a function tool, an ``output_type`` task).

Run with the clients venv's python (.venv-clients, never the server's); the server is found
through OPENAI_BASE_URL (".../v1") and OPENAI_API_KEY. Each command prints one JSON object
(what the client got, and what the tool really returned) for the tests to judge:

    python tests/clients/responses_clients.py MODEL COMMAND...

with COMMAND among sdk-create, sdk-stream, sdk-parse, agents-run, agents-stream and
agents-output (one process for all: the SDKs are imported once). The JSON holds each
command's report under its name; an exception is reported in it (``error``), never hidden;
the exit code is 0 when every command ran to its end."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import traceback
from typing import Any

from pydantic import BaseModel

TIMEOUT_S = 300.0
QUESTION = "What is the weather in Paris? Use the get_weather tool."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Answer(BaseModel):
    answer: int


def _client() -> Any:
    from openai import OpenAI

    return OpenAI(max_retries=0, timeout=TIMEOUT_S)


def _items(output: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in output]


def sdk_create(model: str) -> dict[str, Any]:
    """A call, its output sent back by previous_response_id, then retrieve and delete."""
    client = _client()
    first = client.responses.create(model=model, input=QUESTION, tools=[WEATHER_TOOL])
    calls = [i for i in first.output if i.type == "function_call"]
    result: dict[str, Any] = {
        "first": _items(first.output),
        "first_status": first.status,
        "usage": first.usage.model_dump() if first.usage else None,
    }
    if not calls:
        return result
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": json.dumps({"temperature_c": 21}),
            }
        ],
        tools=[WEATHER_TOOL],
    )
    result |= {"second": _items(second.output), "second_text": second.output_text}
    got = client.responses.retrieve(second.id)
    result["retrieved_same"] = got.id == second.id and got.output_text == second.output_text
    client.responses.delete(second.id)
    try:
        client.responses.retrieve(second.id)
        result["after_delete"] = "found"
    except Exception as exc:  # the SDK's NotFoundError
        result["after_delete"] = type(exc).__name__
    return result


def sdk_stream(model: str) -> dict[str, Any]:
    """The stream helper over a tool turn: every event type in order, the final response."""
    client = _client()
    kinds: list[str] = []
    with client.responses.stream(model=model, input=QUESTION, tools=[WEATHER_TOOL]) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    return {"events": kinds, "final": _items(final.output), "status": final.status}


def sdk_parse(model: str) -> dict[str, Any]:
    """``text.format`` json_schema through ``responses.parse``: a typed answer."""
    client = _client()
    parsed = client.responses.parse(model=model, input="What is 6 times 7?", text_format=Answer)
    value = parsed.output_parsed
    return {"parsed": value.model_dump() if value is not None else None, "text": parsed.output_text}


def _agent(model: str, tool_values: list[int], **kw: Any) -> Any:
    from agents import Agent, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to api.openai.com with our key
    drawn = random.SystemRandom().randint(11, 29)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        tool_values.append(drawn)
        return f"{city}: {drawn} C and sunny"

    # `model` as a name: the SDK's default provider, whose default model is the Responses one
    return Agent(
        name="weather",
        instructions="Answer with the tools.",
        model=model,
        tools=[get_weather],
        **kw,
    )


def _model_class(result: Any) -> str:
    return (
        type(result.last_agent.model).__name__
        if not isinstance(result.last_agent.model, str)
        else "str"
    )


async def agents_run(model: str) -> dict[str, Any]:
    from agents import Runner
    from agents.items import ToolCallItem, ToolCallOutputItem

    values: list[int] = []
    result = await Runner.run(_agent(model, values), QUESTION, max_turns=4)
    calls = [i.raw_item.name for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return {
        "final_output": result.final_output,
        "calls": calls,
        "outputs": outputs,
        "tool_values": values,
        "responses": len(result.raw_responses),
    }


async def agents_stream(model: str) -> dict[str, Any]:
    from agents import Runner

    values: list[int] = []
    result = Runner.run_streamed(_agent(model, values), QUESTION, max_turns=4)
    kinds: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            kinds.append(event.data.type)
    return {"final_output": result.final_output, "raw_events": kinds, "tool_values": values}


async def agents_output(model: str) -> dict[str, Any]:
    from agents import Agent, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="math", instructions="Answer in JSON.", model=model, output_type=Answer)
    result = await Runner.run(agent, "What is 6 times 7?", max_turns=2)
    out = result.final_output
    return {
        "final_output": out.model_dump() if isinstance(out, BaseModel) else out,
        "type": type(out).__name__,
    }


COMMANDS: dict[str, Any] = {
    "sdk-create": sdk_create,
    "sdk-stream": sdk_stream,
    "sdk-parse": sdk_parse,
    "agents-run": agents_run,
    "agents-stream": agents_stream,
    "agents-output": agents_output,
}


async def run(command: str, model: str) -> dict[str, Any]:
    """One command's report; an exception is reported in it, never hidden. All commands run
    in one event loop: the Agents SDK keeps its client (and that client its loop); the
    openai SDK's blocking ones on a thread."""
    report: dict[str, Any] = {}
    try:
        fn = COMMANDS[command]
        if asyncio.iscoroutinefunction(fn):
            report |= await fn(model)
        else:
            report |= await asyncio.to_thread(fn, model)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        report["traceback"] = traceback.format_exc()[-3000:]
    return report


async def run_all(model: str, commands: list[str], *, together: bool = False) -> dict[str, Any]:
    """Each command's report by name: one after another, or all at once (`together`: the
    real model's engine batches them, one command's time instead of the sum)."""
    if together:
        reports = await asyncio.gather(*(run(command, model) for command in commands))
        return dict(zip(commands, reports, strict=True))
    return {command: await run(command, model) for command in commands}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("commands", nargs="+", choices=sorted(COMMANDS))
    ap.add_argument("--together", action="store_true", help="run the commands at once")
    ns = ap.parse_args()
    from importlib.metadata import version

    reports: dict[str, Any] = {
        "versions": {p: version(p) for p in ("openai", "openai-agents")},
        **asyncio.run(run_all(ns.model, ns.commands, together=ns.together)),
    }
    json.dump(reports, sys.stdout, default=str)


if __name__ == "__main__":
    main()
