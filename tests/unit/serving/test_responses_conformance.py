"""Conformance gaps real clients hit in ``POST /v1/responses`` (issue #55, item 4): each
answer checked against the openai SDK's own pydantic types, ``created_at`` fixed per response,
a pasted image kept as a note, a tool output without its call refused as OpenAI refuses it,
``conversation`` and ``prompt`` refused by name, every OpenAI error ``code`` a string or null."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.unit.serving.responses_helpers import (
    APPLY_PATCH,
    FN_WEATHER,
    PATCH,
    create,
    engine_messages,
    events,
)
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import PARIS, assert_openai_error, call

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}


def check_sdk_types(evs: list[dict[str, Any]]) -> None:
    """Every event, and every Response it carries, as the openai SDK's types read them
    (a required field missing raises)."""
    for ev in evs:
        STREAM_EVENT.validate_python(ev)
        if "response" in ev:
            Response.model_validate(ev["response"])


# --------------------------------------------------------------------------- SDK types (gap 5)
@pytest.mark.parametrize(
    "script,tools",
    [
        (["Sunny, 21 C."], None),
        ([call("get_weather", PARIS)], [FN_WEATHER]),
        (["Sure: " + call("get_weather", PARIS)], [FN_WEATHER]),
        ([call("apply_patch", {"input": PATCH})], [APPLY_PATCH]),
    ],
    ids=["text", "call", "text-then-call", "custom-call"],
)
async def test_whole_and_streamed_answers_pass_the_openai_sdk_types(
    harness: Harness, script: list[str], tools: list[dict[str, Any]] | None
) -> None:
    h = harness
    h.engine.chat_content = script[0]
    h.engine.constrained = list(script)
    whole = await create(h, tools=tools)
    assert whole.status_code == 200, whole.text
    usage = Response.model_validate(whole.json()).usage
    assert usage is not None and usage.input_tokens_details.cache_write_tokens == 0
    h.engine.constrained = list(script)
    streamed = await create(h, tools=tools, stream=True)
    assert streamed.status_code == 200, streamed.text
    evs = events(streamed.text)
    check_sdk_types(evs)
    assert evs[-1]["type"] == "response.completed"


async def test_an_incomplete_stream_passes_the_openai_sdk_types(harness: Harness) -> None:
    harness.engine.constrained = ["I think"]
    harness.engine.finish_reason = "length"
    evs = events((await create(harness, stream=True, tools=[FN_WEATHER])).text)
    assert evs[-1]["type"] == "response.incomplete"
    check_sdk_types(evs)


# --------------------------------------------------------------------------- created_at (gap 2)
async def test_created_at_is_one_value_per_response(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock moves a second at every reading: each snapshot of one response still
    says when that response was created."""
    ticks = itertools.count(int(time.time()))
    monkeypatch.setattr(time, "time", lambda: float(next(ticks)))
    harness.engine.constrained = ["Sure: " + call("get_weather", PARIS)]
    evs = events((await create(harness, stream=True, tools=[FN_WEATHER])).text)
    stamps = {ev["response"]["created_at"] for ev in evs if "response" in ev}
    assert len([ev for ev in evs if "response" in ev]) >= 3
    assert len(stamps) == 1, stamps
    final = evs[-1]["response"]
    stored = (await harness.client.get(f"/v1/responses/{final['id']}")).json()
    assert stored["created_at"] == final["created_at"]


# --------------------------------------------------------------------------- images (gap 1)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_pasted_image_becomes_a_note_with_tools(harness: Harness, stream: bool) -> None:
    """Codex keeps a pasted image in its history: every later turn carries it."""
    h = harness
    h.engine.constrained = ["A red square."]
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is on it?"}, IMAGE],
        }
    ]
    resp = await create(h, input=items, tools=[FN_WEATHER], stream=stream)
    assert resp.status_code == 200, resp.text
    assert "input_image" in resp.headers["x-loopstack-notes"]
    final = events(resp.text)[-1]["response"] if stream else resp.json()
    assert any("input_image" in n for n in final["loopstack"]["notes"])
    prompt = engine_messages(h)
    assert "What is on it?" in prompt and "[an image was attached here" in prompt
    assert "iVBORw0KGgo" not in prompt


async def test_a_pasted_image_without_tools_is_a_note_too(harness: Harness) -> None:
    harness.engine.chat_content = "A red square."
    items = [{"role": "user", "content": [IMAGE, {"type": "input_text", "text": "What?"}]}]
    resp = await create(harness, input=items)
    assert resp.status_code == 200, resp.text
    [sent] = [m for m in harness.engine.requests[-1][1]["messages"] if m["role"] == "user"]
    assert sent["content"].startswith("[an image was attached here") and "What?" in sent["content"]


# --------------------------------------------------------------------------- orphan outputs (gap 3)
@pytest.mark.parametrize(
    "kind,what", [("function_call_output", "function"), ("custom_tool_call_output", "custom tool")]
)
async def test_a_tool_output_without_its_call_is_400_naming_the_id(
    harness: Harness, kind: str, what: str
) -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": kind, "call_id": "call_nope", "output": "sunny"},
    ]
    resp = await create(harness, input=items, tools=[FN_WEATHER])
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    # OpenAI's own words (openai-python users report them: continuedev/continue#10092)
    assert err["message"] == f"No tool call found for {what} call output with call_id call_nope."
    assert err["param"] == "input" and err["code"] is None
    assert harness.engine.requests == []


async def test_a_tool_output_may_answer_a_call_of_the_previous_response(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS)]
    first = (await create(h, tools=[FN_WEATHER])).json()
    [fc] = first["output"]
    h.engine.constrained = ["It is sunny."]
    answer = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
    ok = await create(h, input=[answer], tools=[FN_WEATHER], previous_response_id=first["id"])
    assert ok.status_code == 200, ok.text
    # the same output after a chain that never made that call
    other = (await create(h, input="hi", store=True)).json()
    bad = await create(h, input=[answer], tools=[FN_WEATHER], previous_response_id=other["id"])
    err = assert_openai_error(bad, 400)
    assert fc["call_id"] in err["message"] and err["param"] == "input"


async def test_calls_of_skipped_item_types_still_pair_with_their_outputs(harness: Harness) -> None:
    """Codex answers a ``local_shell_call`` with a ``function_call_output``: the call item is
    skipped (not served) but its output is no orphan."""
    harness.engine.constrained = ["Listed."]
    items = [
        {"role": "user", "content": "ls"},
        {"type": "local_shell_call", "call_id": "sh_1", "status": "completed",
         "action": {"type": "exec", "command": ["ls"]}},
        {"type": "function_call_output", "call_id": "sh_1", "output": "a.txt"},
    ]  # fmt: skip
    resp = await create(harness, input=items, tools=[FN_WEATHER])
    assert resp.status_code == 200, resp.text


# ------------------------------------------------------------- conversation, prompt (gap 9)
@pytest.mark.parametrize(
    "field,value",
    [
        ("conversation", "conv_123"),
        ("conversation", {"id": "conv_123"}),
        ("prompt", {"id": "pmpt_123", "version": "2", "variables": {"city": "Paris"}}),
    ],
)
async def test_conversation_and_prompt_are_refused_by_name(
    harness: Harness, field: str, value: Any
) -> None:
    resp = await harness.client.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", field: value}
    )
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert err["param"] == field and field in err["message"]
    assert harness.engine.requests == []
    # null is the same as absent (clients send it so)
    harness.engine.chat_content = "hello"
    resp = await harness.client.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", field: None}
    )
    assert resp.status_code == 200, resp.text


# --------------------------------------------------------------------------- error codes (gap 4)
async def test_every_openai_error_code_is_a_string_or_null(harness: Harness) -> None:
    """openai-python's ``APIError.code`` is ``Optional[str]``, Codex's ``Option<String>``:
    an integer there breaks Codex's parse of the error. Each way an error body is built."""
    h = harness
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ("POST", "/v1/chat/completions", {"model": MODEL}, 400),  # validation: missing field
        ("POST", "/v1/chat/completions", {**chat, "temperature": "hot"}, 400),  # wrong type
        ("POST", "/v1/chat/completions", {**chat, "n": 0}, 400),  # a bad value
        ("POST", "/v1/responses", {"model": MODEL, "input": "x", "background": True}, 400),
        ("POST", "/v1/responses", {"model": "gpt-5", "input": "x"}, 404),
        ("GET", "/v1/responses/resp_nope", None, 404),
        ("GET", "/v1/nowhere", None, 404),  # the framework's own answers
        ("DELETE", "/v1/chat/completions", None, 405),
    ]
    for method, path, payload, status in cases:
        resp = await h.client.request(method, path, json=payload)
        err = assert_openai_error(resp, status)
        assert err["code"] is None or isinstance(err["code"], str), (path, payload, err)
    missing = (await h.client.post("/v1/chat/completions", json={"model": MODEL})).json()
    assert missing["error"]["code"] == "missing_required_parameter"
    wrong = await h.client.post("/v1/chat/completions", json={**chat, "temperature": "hot"})
    assert wrong.json()["error"]["code"] == "invalid_type"
    bad = await h.client.post("/v1/chat/completions", json={**chat, "n": 0})
    assert bad.json()["error"]["code"] == "invalid_value"
    from loopstack.serving.http.app import validation_code

    assert validation_code("extra_forbidden") == "unknown_parameter"
    assert validation_code("json_invalid") is None


def test_error_bodies_built_from_exceptions_carry_no_status_as_code() -> None:
    from loopstack.serving.exceptions import (
        EngineError,
        InvalidRequest,
        ServingError,
        UpstreamError,
    )

    for exc in (
        ServingError("boom"),
        EngineError("down"),
        InvalidRequest("bad", param="x"),
        UpstreamError(400, {"error": {"message": "vLLM says no", "code": 400}}),
        UpstreamError(500, {"error": {"message": "vLLM fell over", "code": 500}}),
    ):
        code = exc.to_body()["error"]["code"]
        assert code is None or isinstance(code, str), (exc, code)
    # the engine's own string code is passed on
    upstream = UpstreamError(400, {"error": {"message": "x", "code": "context_length_exceeded"}})
    assert upstream.to_body()["error"]["code"] == "context_length_exceeded"
    assert UpstreamError(400, {"error": {"message": "x", "code": 400}}).status_code == 400


async def test_the_500_handler_says_nothing_and_has_no_integer_code() -> None:
    import json

    from loopstack.serving.http.app import unexpected

    resp = await unexpected(None, RuntimeError("secret detail"))  # type: ignore[arg-type]
    err = json.loads(bytes(resp.body))["error"]
    assert resp.status_code == 500 and err["code"] is None and "secret" not in err["message"]
