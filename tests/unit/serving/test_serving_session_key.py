"""The session key reaches every engine request, so a session-aware router (vLLM
production-stack's `--routing-logic session --session-key x-session-id`) keeps an agent's
steps on one vLLM replica. The real router and `VLLMEngine` run; only the network is an
httpx MockTransport that answers like vLLM (from the scripted FakeEngine) and records headers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from loopstack.serving.config import DEFAULT_BACKEND
from loopstack.serving.engine.supervisor import VLLMEngine
from tests.unit.serving.serving_fakes import FakeEngine, Harness
from tests.unit.serving.serving_helpers import ADD, PARIS, WEATHER, call, chat_body, sse_events

HEADER = "x-session-id"


class RecordingVLLM:
    """An httpx transport handler: vLLM's answers come from a FakeEngine script."""

    def __init__(self) -> None:
        self.script = FakeEngine()
        self.seen: list[tuple[str, str | None]] = []  # (path, x-session-id or None)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        self.seen.append((request.url.path, request.headers.get(HEADER)))
        if not body.get("stream"):
            return httpx.Response(200, json=await self.script._post(request.url.path, body))
        lines = [line async for line in self.script._stream(request.url.path, body)]
        return httpx.Response(200, content=b"\n\n".join(lines) + b"\n\n")


@pytest.fixture
async def wired(
    make_harness: Any, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Harness, RecordingVLLM]]:
    """A harness whose engine is a real VLLMEngine talking to the recording transport (the
    default constraint backend, or the one named by an indirect parameter)."""
    h: Harness = make_harness(backend=getattr(request, "param", DEFAULT_BACKEND))
    vllm = RecordingVLLM()
    engine = VLLMEngine([], env={}, port=0, model_name="engine", base_url="http://router.test")
    await engine._client.aclose()
    engine._client = engine.transport.client = httpx.AsyncClient(
        transport=httpx.MockTransport(vllm), base_url="http://router.test"
    )
    h.state.engine = engine
    h.chat.engine = engine
    yield h, vllm
    await engine._client.aclose()


@pytest.mark.parametrize(
    ("headers", "user", "expected"),
    [
        pytest.param({HEADER: "sess-1"}, None, "sess-1", id="header"),
        pytest.param({}, "alice", "alice", id="user-field"),
        pytest.param({HEADER: "sess-2"}, "alice", "sess-2", id="header-wins"),
        pytest.param({}, None, None, id="none"),
    ],
)
async def test_plain_chat_forwards_the_session_key(
    wired: tuple[Harness, RecordingVLLM],
    headers: dict[str, str],
    user: str | None,
    expected: str | None,
) -> None:
    h, vllm = wired
    extra = {"user": user} if user else {}
    resp = await h.client.post("/v1/chat/completions", json=chat_body(**extra), headers=headers)
    assert resp.status_code == 200, resp.text
    assert vllm.seen == [("/v1/chat/completions", expected)]


@pytest.mark.parametrize(("wired", "calls"), [("outlines", 3), ("guidance", 1)],
                         indirect=["wired"])  # fmt: skip
async def test_every_engine_call_of_a_streamed_auto_tool_call_carries_the_key(
    wired: tuple[Harness, RecordingVLLM], calls: int
) -> None:
    h, vllm = wired
    # auto mode: outlines - a free stream that turns into a call, then the constrained head
    # and arguments; guidance - the whole turn in one request, under the turn's grammar
    vllm.script.free = ["Checking.\n<tool_call>\n" + call("get_weather", {"city": "Rome"})]
    vllm.script.constrained = [call("get_weather", PARIS) + "\n</tool_call>"]
    body = chat_body(tools=[WEATHER, ADD], stream=True, user="agent-7")
    resp = await h.client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    events = sse_events(resp.text)
    names = [
        tc["function"].get("name")
        for e in events
        for tc in (e["choices"][0]["delta"].get("tool_calls") or [])
        if e.get("choices")
    ]
    assert "get_weather" in names
    assert len(vllm.seen) >= calls, vllm.seen  # outlines: free stream + head + arguments
    assert {key for _, key in vllm.seen} == {"agent-7"}


async def test_completions_forward_the_key_and_requests_do_not_leak_it(
    wired: tuple[Harness, RecordingVLLM],
) -> None:
    h, vllm = wired
    body = {"model": "test-model", "prompt": "Hi", "max_tokens": 4}
    first = await h.client.post("/v1/completions", json=body, headers={HEADER: "s-9"})
    second = await h.client.post("/v1/completions", json=body)
    assert first.status_code == second.status_code == 200
    assert vllm.seen == [("/v1/completions", "s-9"), ("/v1/completions", None)]


async def test_a_key_that_is_no_header_value_is_sent_as_its_digest(
    wired: tuple[Harness, RecordingVLLM],
) -> None:
    h, vllm = wired
    user = "José\nbad " + "x" * 200
    resp = await h.client.post("/v1/chat/completions", json=chat_body(user=user))
    assert resp.status_code == 200, resp.text
    assert vllm.seen == [("/v1/chat/completions", hashlib.sha256(user.encode()).hexdigest())]
