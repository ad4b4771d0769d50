"""The agent's model error carries the endpoint's HTTP status as a field, and the loop
decides by that field, never by the text of the message."""

from __future__ import annotations

import json

import pytest


def _agent(status: int, message: str) -> tuple[object, list[dict[str, object]]]:
    """An agent whose endpoint answers the final request with ``response_format`` by
    ``status`` / ``message``, and the plain final request (no tools) with a text answer."""
    from openai import AsyncOpenAI

    from loopstack.agent.run.loop import Agent
    from loopstack.agent.scripted import ScriptedModel, call, httpx
    from loopstack.agent.tools.registry import ToolRegistry

    def weather(city: str) -> dict[str, object]:
        """Weather.

        Args:
            city: the city
        """
        return {"city": city, "temperature": 18}

    model = ScriptedModel([call("weather", city="Paris"), call("weather", city="Paris")])
    finals: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            if body.get("response_format") or "tools" not in body:
                finals.append(body)
            if body.get("response_format"):
                err = {"message": message, "type": "BadRequestError", "code": status}
                return httpx.Response(status, json={"error": err})
            if "tools" not in body:
                reply = {"role": "assistant", "content": "It is 18 degrees in Paris."}
                return httpx.Response(
                    200,
                    json={
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "scripted-model",
                        "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    },
                )
        return model(request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = AsyncOpenAI(base_url="http://s/v1", api_key="k", http_client=http, max_retries=0)
    return Agent(client, "scripted-model", ToolRegistry([weather])), finals


async def test_a_400_to_the_answer_format_asks_again_without_it() -> None:
    agent, finals = _agent(400, "response_format is not supported by this model")
    result = await agent.run("How many degrees in Paris?")  # type: ignore[attr-defined]
    assert [bool(f.get("response_format")) for f in finals] == [True, False]
    assert result.answer == "It is 18 degrees in Paris."


async def test_a_500_whose_message_says_400_is_not_taken_for_a_400() -> None:
    """Deciding by the message (``"400" in exc.message``) took this 500 for a refused format
    and asked again; by the status field it is a model error: no second request."""
    agent, finals = _agent(500, "KV cache full: 4000 blocks in use")
    result = await agent.run("How many degrees in Paris?")  # type: ignore[attr-defined]
    assert [bool(f.get("response_format")) for f in finals] == [True]
    assert result.answer.startswith("Stopped early")


@pytest.mark.parametrize("status", [400, 404, 503])
async def test_the_model_error_holds_the_status(status: int) -> None:
    from loopstack.agent.exceptions import ModelError
    from loopstack.agent.run.loop import Agent
    from loopstack.agent.scripted import Reply, ScriptedModel
    from loopstack.agent.tools.registry import ToolRegistry

    model = ScriptedModel([Reply(status=status)])
    agent = Agent(model.client(), "scripted-model", ToolRegistry([]))
    with pytest.raises(ModelError) as caught:
        await agent._chat("run.1", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status == status
    assert caught.value.kind == "model_error"


async def test_a_timeout_is_a_model_error_without_status() -> None:
    import asyncio

    from openai import AsyncOpenAI

    from loopstack.agent.exceptions import ModelError
    from loopstack.agent.run.loop import Agent
    from loopstack.agent.scripted import httpx
    from loopstack.agent.tools.registry import ToolRegistry

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(500)

    http = httpx.AsyncClient(transport=httpx.MockTransport(slow))
    client = AsyncOpenAI(base_url="http://s/v1", api_key="k", http_client=http, max_retries=0)
    agent = Agent(client, "scripted-model", ToolRegistry([]))
    with pytest.raises(ModelError) as caught:
        await agent._chat("run.1", deadline=0.05, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status is None
