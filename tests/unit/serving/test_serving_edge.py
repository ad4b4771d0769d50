"""The HTTP edge: limits, auth before the body, hostile values - each an OpenAI-style 4xx that
reaches neither the engine nor the model, and never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loopstack.serving.exceptions import error_body
from loopstack.serving.http.limits import EdgeGuard, Limits, key_matches
from loopstack.serving.protocol import MAX_JSON_DEPTH
from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import (
    USER,
    WEATHER,
    assert_openai_error,
    chat_body,
    post_chat,
)

JSON = {"content-type": "application/json"}


async def post_raw(h: Harness, raw: str | bytes, path: str = "/v1/chat/completions") -> Any:
    data = raw.encode() if isinstance(raw, str) else raw
    return await h.client.post(path, content=data, headers=JSON)


def chat_raw(**fields: str) -> str:
    """A chat body with some fields given as raw JSON text (NaN, escapes, ...)."""
    parts = [f'"model": "{MODEL}"', '"messages": ' + json.dumps(USER)]
    parts += [f'"{k}": {v}' for k, v in fields.items()]
    return "{" + ", ".join(parts) + "}"


# --------------------------------------------------------------------------- hostile values
HOSTILE = [
    pytest.param(chat_raw(temperature="NaN"), "temperature", id="nan-temperature"),
    pytest.param(chat_raw(top_p="Infinity"), "top_p", id="inf-top_p"),
    pytest.param(chat_raw(top_k="-Infinity"), "top_k", id="inf-extra"),
    pytest.param(chat_raw(repetition_penalty="1e999"), "repetition_penalty", id="1e999"),
    pytest.param(chat_raw(seed=str(10**30)), "seed", id="huge-seed"),
    pytest.param(chat_raw(max_tokens=str(10**12)), "max_tokens", id="huge-max_tokens"),
    pytest.param(chat_raw(max_tokens="1e300"), "max_tokens", id="float-max_tokens"),
    pytest.param(chat_raw(logit_bias='{"1": NaN}'), "logit_bias", id="nan-nested"),
    pytest.param(
        '{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "\\ud800x"}]}',
        "messages",
        id="lone-surrogate",
    ),
    pytest.param(chat_raw(user='"\\udfff"'), "user", id="lone-surrogate-extra"),
    pytest.param(chat_raw(**{"\\ud83d": "1"}), None, id="lone-surrogate-key"),
    pytest.param('{"model": "' + MODEL + '", "messages": []}', "messages", id="empty-messages"),
    pytest.param('{"model": "' + MODEL + '"}', "messages", id="no-messages"),
    pytest.param('{"model": "' + MODEL + '", "messages": {}}', "messages", id="messages-object"),
    pytest.param('{"model": "' + MODEL + '", "messages": [1]}', "messages", id="message-int"),
    pytest.param("[]", None, id="body-list"),
    pytest.param('"x"', None, id="body-string"),
    pytest.param(chat_raw(stop="[1, 2]"), "stop", id="stop-ints"),
    pytest.param(chat_raw(n="1.5"), "n", id="n-fraction"),
]


@pytest.mark.parametrize("raw,param", HOSTILE)
async def test_hostile_values_are_400s(harness: Harness, raw: str, param: str | None) -> None:
    resp = await post_raw(harness, raw)
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    if param is not None:
        assert param in (err["param"] or "") + err["message"], err
    assert harness.engine.requests == []


def history(*calls: Any) -> dict[str, Any]:
    return chat_body(
        tools=[WEATHER], messages=[*USER, {"role": "assistant", "tool_calls": list(calls)}]
    )


@pytest.mark.parametrize(
    "body",
    [
        history({"function": "get_weather"}),
        history(1),
        history({}),
        history({"function": {"name": 5, "arguments": "{}"}}),
        history({"function": {"name": "get_weather", "arguments": 5}}),
        history({"type": "retrieval", "function": {"name": "get_weather"}}),
        chat_body(messages=[{"role": "assistant", "tool_calls": "x"}]),
    ],
    ids=["function-string", "int", "empty", "name-int", "args-int", "type",
         "not-a-list"],
)  # fmt: skip
@pytest.mark.parametrize("tool_choice", ["none", "required"])
async def test_malformed_tool_call_history_is_400(
    harness: Harness, body: dict[str, Any], tool_choice: str
) -> None:
    resp = await harness.client.post(
        "/v1/chat/completions", json={**body, "tool_choice": tool_choice}
    )
    err = assert_openai_error(resp, 400, type_="invalid_request_error")
    assert (err["param"] or "").startswith("messages"), err
    assert harness.engine.requests == []


async def test_history_arguments_cut_by_max_tokens_are_carried_as_a_string(
    harness: Harness,
) -> None:
    """Our own reply cut at max_tokens ("length") echoed back must not end the conversation."""
    body = history({"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Pa'}})
    resp = await harness.client.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert resp.status_code == 200, resp.text
    [(_, sent)] = harness.engine.requests
    args = sent["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == '{"city": "Pa'


async def test_a_well_formed_history_still_works(harness: Harness) -> None:
    body = history({"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "X"}}})
    resp = await harness.client.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert resp.status_code == 200, resp.text
    [(_, sent)] = harness.engine.requests
    call = sent["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "X"}  # object -> JSON text


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 5, 50_000])
async def test_deep_nesting_is_a_400(harness: Harness, depth: int) -> None:
    raw = chat_raw(metadata="[" * depth + "]" * depth)
    assert_openai_error(await post_raw(harness, raw), 400)
    assert (await harness.client.get("/health")).status_code == 200


@pytest.mark.parametrize(
    "prompt", [[], [-1], [[]], [1, "a"], [2**40], None, {"a": 1}], ids=lambda p: json.dumps(p)
)
async def test_bad_completion_prompts_are_400(harness: Harness, prompt: Any) -> None:
    resp = await harness.client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    err = assert_openai_error(resp, 400)
    assert (err["param"] or "").startswith("prompt"), err
    assert harness.engine.requests == []


async def test_non_ascii_request_id_is_replaced(harness: Harness) -> None:
    for bad in [b"\xff\xfe\x00", "é".encode(), b"a" * 500, b"a b"]:
        resp = await harness.client.get("/health", headers={b"x-request-id": bad})
        assert resp.status_code == 200
        rid = resp.headers["x-request-id"]
        assert len(rid) == 16 and rid.isalnum(), rid
    resp = await harness.client.get("/health", headers={"x-request-id": "req-1.2:3"})
    assert resp.headers["x-request-id"] == "req-1.2:3"


async def test_unknown_paths_do_not_grow_metrics(harness: Harness) -> None:
    for i in range(40):
        await harness.client.get(f"/random/{i}/path")
        await harness.client.post(f"/v1/nothing-{i}", json={})
    text = (await harness.client.get("/metrics")).text
    assert "/random/" not in text and "/v1/nothing" not in text
    assert harness.metric("loopstack_requests_total", route="unmatched", status="404") == 80
    await post_chat(harness)
    assert harness.metric("loopstack_requests_total", route="/v1/chat/completions", status="200")


def test_error_body_is_always_encodable() -> None:
    body = error_body("bad \ud800 value", type_="invalid_request_error", code=400, param="\udfff")
    json.dumps(body, ensure_ascii=False).encode("utf-8")  # would raise on a lone surrogate
    assert set(body["error"]) == {"message", "type", "param", "code"}


# --------------------------------------------------------------------------- limits
LIMITS = Limits(max_messages=3, max_tools=2, max_stop=2, max_prompts=2, max_request_bytes=4096)


@pytest.mark.parametrize(
    "body,param,code",
    [
        (chat_body(messages=USER * 4), "messages", "too_many_messages"),
        (chat_body(tools=[WEATHER] * 3), "tools", "too_many_tools"),
        (chat_body(stop=["a", "b", "c"]), "stop", None),
    ],  # max_tokens beyond the context is lowered, not refused: test_messages_api.py
    ids=["messages", "tools", "stop"],
)
async def test_chat_limits(make_harness: Any, body: dict[str, Any], param: str, code: Any) -> None:
    h = make_harness(limits=LIMITS, max_model_len=512)
    err = assert_openai_error(await h.client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    assert h.engine.requests == []
    assert (await post_chat(h, messages=USER * 3, stop=["a", "b"])).status_code == 200


async def test_completion_limits(make_harness: Any) -> None:
    h = make_harness(limits=LIMITS, max_model_len=512)
    for body in [{"prompt": ["a", "b", "c"]}, {"prompt": "a", "stop": ["1", "2", "3"]},
                 {"prompt": [[1], [2], [3]]}]:  # fmt: skip
        resp = await h.client.post("/v1/completions", json={"model": MODEL, **body})
        assert_openai_error(resp, 400)
    assert h.engine.requests == []
    resp = await h.client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3]})
    assert resp.status_code == 200, resp.text


async def test_body_over_the_limit_is_413(make_harness: Any) -> None:
    h = make_harness(limits=LIMITS)
    big = chat_body(messages=[{"role": "user", "content": "x" * 5000}])
    err = assert_openai_error(await h.client.post("/v1/chat/completions", json=big), 413)
    assert err["code"] == "request_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted while reading
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    resp = await h.client.post("/v1/chat/completions", content=chunks(), headers=JSON)
    assert_openai_error(resp, 413)
    assert h.engine.requests == []
    assert (await post_chat(h)).status_code == 200


async def test_body_limit_stops_reading_early() -> None:
    """The guard stops at the limit: it never pulls the rest of a huge body."""
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def app(*_: Any) -> None:  # pragma: no cover - must not be reached
        raise AssertionError("the app ran")

    guard = EdgeGuard(app, api_key=None, max_request_bytes=10 * 1024)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await asyncio.wait_for(guard(scope, receive, send), 5)
    assert sent[0]["status"] == 413 and pulled == 11


# --------------------------------------------------------------------------- auth
async def test_auth_is_checked_before_the_body_is_read() -> None:
    async def receive() -> dict[str, Any]:  # pragma: no cover - must not be called
        raise AssertionError("the body was read before the key was checked")

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def app(*_: Any) -> None:  # pragma: no cover
        raise AssertionError("the app ran")

    guard = EdgeGuard(app, api_key="k", max_request_bytes=1024)
    headers = [(b"content-length", b"999999999"), (b"authorization", b"Bearer nope")]
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers}
    await guard(scope, receive, send)
    assert sent[0]["status"] == 401


@pytest.mark.parametrize(
    "configured,header,ok",
    [
        ("k", "Bearer k", True),
        ("k", "bearer  k ", True),
        ("k", "Bearer K", False),
        ("k", "Bearer", False),
        ("k", "Basic k", False),
        ("", "Bearer", False),
        ("", "Bearer ", False),
        ("", "", False),
        ("kéy", "Bearer kéy", True),
        ("k", "Bearer \udcff", False),
    ],
)
def test_key_matches(configured: str, header: str, ok: bool) -> None:
    assert key_matches(configured, header) is ok


async def test_empty_configured_key_refuses_a_bare_bearer(make_harness: Any) -> None:
    h = make_harness(api_key="")
    for header in ["Bearer", "Bearer ", ""]:
        resp = await h.client.get("/v1/models", headers={"authorization": header})
        assert_openai_error(resp, 401, type_="authentication_error")
    assert (await h.client.get("/health")).status_code == 200


async def test_unauthenticated_big_body_is_401_not_413(make_harness: Any) -> None:
    h = make_harness(api_key="k", limits=LIMITS)
    resp = await h.client.post("/v1/chat/completions", content=b"x" * 10_000, headers=JSON)
    assert_openai_error(resp, 401)


# --------------------------------------------------------------------------- embeddings
class FakeEmbeddings:
    model_name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    async def create(self, req: Any, texts: list[str]) -> dict[str, Any]:
        self.seen.append(texts)
        data = [{"object": "embedding", "index": i, "embedding": [0.0]} for i in range(len(texts))]
        return {"object": "list", "data": data, "model": req.model, "usage": {}}


async def test_embeddings_take_an_admission_slot_and_are_limited(make_harness: Any) -> None:
    limits = Limits(max_embedding_inputs=3, max_embedding_input_chars=10)
    h = make_harness(max_running=1, max_waiting=0, limits=limits)
    fake = FakeEmbeddings()
    h.state.embeddings = fake  # type: ignore[assignment]
    body = {"model": "all-MiniLM-L6-v2", "input": ["a" * 50, "b"]}
    resp = await h.client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    assert fake.seen == [["a" * 10, "b"]]
    resp = await h.client.post("/v1/embeddings", json={**body, "input": ["a"] * 4})
    assert assert_openai_error(resp, 400)["code"] == "too_many_inputs"
    for bad in ['[""]', "[]", "[1]", '"\\ud800"', "NaN"]:
        raw = '{"model": "all-MiniLM-L6-v2", "input": ' + bad + "}"
        assert_openai_error(await post_raw(h, raw, "/v1/embeddings"), 400)
    h.engine.gate = asyncio.Event()  # a generation holds the only slot
    running = asyncio.ensure_future(post_chat(h))
    await asyncio.wait_for(h.engine.entered.wait(), 5)
    assert_openai_error(await h.client.post("/v1/embeddings", json=body), 429)
    h.engine.gate.set()
    assert (await running).status_code == 200
    assert (await h.client.post("/v1/embeddings", json=body)).status_code == 200
    assert h.metric("loopstack_requests_running") == 0
