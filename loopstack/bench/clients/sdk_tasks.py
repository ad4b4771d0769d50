"""The SDK clients' tasks, run by the client bench with the clients venv's python
(``.venv-clients``, `make clients`): this file imports only the clients' own packages and the
standard library, never the bench or the server.

    python sdk_tasks.py CLIENT MODEL VALUE

CLIENT is one of openai-chat, openai-responses, anthropic, agents. The server comes from
OPENAI_BASE_URL (``…/v1``) and OPENAI_API_KEY, or ANTHROPIC_BASE_URL (no ``/v1``) and
ANTHROPIC_API_KEY. The task is one tool round trip: the user asks for the weather in Paris,
the ``get_weather`` tool answers "VALUE°C and foggy" (VALUE drawn by the bench for this run:
the model cannot guess it), and the model answers; the Agents SDK's answer is an
``output_type`` (``WeatherReport``). Every model call streams, through the SDK's own stream
helper. Prints one JSON object: the final answer (or output), the tool's calls, the model
calls made, the error if one was raised (reported, never hidden)."""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from importlib.metadata import version
from typing import Any

from pydantic import BaseModel

TIMEOUT_S = 1200.0
MAX_CALLS = 4  # model calls per run: a call, the answer, two spare
GAVE_UP = f"no answer in {MAX_CALLS} model calls: each was a tool call"
QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
DESCRIPTION = "The current weather in a city: temperature in degrees Celsius and conditions."
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city's name"}},
    "required": ["city"],
    "additionalProperties": False,
}


class WeatherReport(BaseModel):
    city: str
    temperature_c: int
    conditions: str


class Task:
    """The tool of one run: what it returns, and every call it got."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.ran: list[str] = []

    def get_weather(self, city: str) -> str:
        self.ran.append(city)
        return f"{self.value}°C and foggy"

    def call(self, arguments: str | dict[str, Any]) -> str:
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            return "error: the arguments are not JSON"
        city = args.get("city") if isinstance(args, dict) else None
        return self.get_weather(str(city)) if city else "error: city is required"


def openai_chat(model: str, task: Task) -> dict[str, Any]:
    """``chat.completions.create(stream=True)``, the chunks put together as most user code
    does (the SDK's ``stream`` helper would require a ``strict`` tool)."""
    from openai import OpenAI

    client = OpenAI(max_retries=0, timeout=TIMEOUT_S)
    tools: Any = [{"type": "function", "function": {"name": "get_weather",
                                                     "description": DESCRIPTION,
                                                     "parameters": PARAMETERS}}]  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    for calls in range(1, MAX_CALLS + 1):
        text = ""
        pending: dict[int, dict[str, str]] = {}  # the tool calls by index
        for chunk in client.chat.completions.create(
            model=model, messages=messages, tools=tools, stream=True
        ):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or []:
                got = pending.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                got["id"] = tc.id or got["id"]
                if tc.function:
                    got["name"] += tc.function.name or ""
                    got["arguments"] += tc.function.arguments or ""
        if not pending:
            return {"answer": text, "model_calls": calls}
        messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in pending.values()]})  # fmt: skip
        for c in pending.values():
            result = task.call(c["arguments"]) if c["name"] == "get_weather" else "error: no tool"
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return {"answer": None, "model_calls": MAX_CALLS, "gave_up": GAVE_UP}


def openai_responses(model: str, task: Task) -> dict[str, Any]:
    """Full history each turn (no ``previous_response_id``), as Codex and the Agents SDK do."""
    from openai import OpenAI

    client = OpenAI(max_retries=0, timeout=TIMEOUT_S)
    tools: Any = [{"type": "function", "name": "get_weather", "description": DESCRIPTION,
                   "parameters": PARAMETERS, "strict": True}]  # fmt: skip
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    for calls in range(1, MAX_CALLS + 1):
        with client.responses.stream(model=model, input=items, tools=tools) as s:
            for _ in s:
                pass
            response = s.get_final_response()
        fcalls = [i for i in response.output if i.type == "function_call"]
        if not fcalls:
            return {"answer": response.output_text, "model_calls": calls}
        for i in response.output:
            if i.type == "message":
                items.append({"role": "assistant", "content": i.content[0].text})  # type: ignore[union-attr]
        for fc in fcalls:
            items.append({"type": "function_call", "call_id": fc.call_id, "name": fc.name,
                          "arguments": fc.arguments})  # fmt: skip
            result = task.call(fc.arguments) if fc.name == "get_weather" else "error: no tool"
            items.append({"type": "function_call_output", "call_id": fc.call_id, "output": result})
    return {"answer": None, "model_calls": MAX_CALLS, "gave_up": GAVE_UP}


def anthropic_messages(model: str, task: Task) -> dict[str, Any]:
    import anthropic

    client = anthropic.Anthropic(max_retries=0, timeout=TIMEOUT_S)
    tools: Any = [{"name": "get_weather", "description": DESCRIPTION,
                   "input_schema": PARAMETERS}]  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    for calls in range(1, MAX_CALLS + 1):
        with client.messages.stream(
            model=model, max_tokens=512, messages=messages, tools=tools
        ) as s:
            for _ in s:
                pass
            message = s.get_final_message()
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            text = "".join(b.text for b in message.content if b.type == "text")
            return {"answer": text, "model_calls": calls, "stop_reason": message.stop_reason}
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in message.content]}
        )  # fmt: skip
        results = [
            {"type": "tool_result", "tool_use_id": u.id,
             "content": task.call(u.input) if u.name == "get_weather" else "error: no tool"}
            for u in uses
        ]  # fmt: skip
        messages.append({"role": "user", "content": results})
    return {"answer": None, "model_calls": MAX_CALLS, "gave_up": GAVE_UP}


async def agents_output(model: str, task: Task) -> dict[str, Any]:
    """The Agents SDK with its default model class (`OpenAIResponsesModel`), a function tool
    and ``output_type=WeatherReport``, streamed (``Runner.run_streamed``)."""
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to api.openai.com with our key

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city: temperature in degrees Celsius and conditions.

        Args:
            city: the city's name.
        """
        return task.get_weather(city)

    agent = Agent(
        name="weather",
        instructions="Answer with the tools.",
        model=model,
        tools=[get_weather],
        output_type=WeatherReport,
    )
    result = Runner.run_streamed(agent, QUESTION, max_turns=MAX_CALLS)
    async for _ in result.stream_events():
        pass
    out = result.final_output
    return {
        "output": out.model_dump() if isinstance(out, BaseModel) else out,
        "output_type": type(out).__name__,
        "model_calls": len(result.raw_responses),
    }


CLIENTS: dict[str, Any] = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "anthropic": anthropic_messages,
    "agents": agents_output,
}
PACKAGES = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic",
            "agents": "openai-agents"}  # fmt: skip


def run_task(argv: list[str]) -> int:
    client, model, value = argv[0], argv[1], int(argv[2])
    task = Task(value)
    report: dict[str, Any] = {"client": client, "version": version(PACKAGES[client])}
    try:
        out = CLIENTS[client](model, task)
        report |= asyncio.run(out) if asyncio.iscoroutine(out) else out
    except Exception as exc:  # reported, judged by the bench
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        report["traceback"] = traceback.format_exc()[-3000:]
    report["tool_ran"] = task.ran
    json.dump(report, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(run_task(sys.argv[1:]))
