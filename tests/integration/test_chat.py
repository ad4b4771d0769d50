"""Plain chat, streaming, completions, embeddings, models, health and metrics - real model."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_models_lists_chat_and_embedding_model(client: OpenAI, server: Server) -> None:
    ids = [m.id for m in client.models.list().data]
    assert server.model in ids
    assert "all-MiniLM-L6-v2" in ids


def test_chat_completion(client: OpenAI, server: Server) -> None:
    r = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "What is the capital of France? One word."}],
        max_tokens=16,
        temperature=0,
    )
    assert "paris" in (r.choices[0].message.content or "").lower()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_chat_streaming_matches_shape(client: OpenAI, server: Server) -> None:
    stream = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Count from 1 to 5, separated by spaces."}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert "1" in text and "3" in text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0


def test_completions_endpoint(client: OpenAI, server: Server) -> None:
    r = client.completions.create(model=server.model, prompt="def add(a, b):", max_tokens=12)
    assert r.choices[0].text


def test_embeddings(client: OpenAI) -> None:
    r = client.embeddings.create(
        model="all-MiniLM-L6-v2",
        input=["The cat sits on the mat.", "A cat is sitting on a rug.", "Stock prices fell."],
    )
    vecs = [d.embedding for d in r.data]
    assert [len(v) for v in vecs] == [384, 384, 384]

    def cos(a: list[float], b: list[float]) -> float:
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.2
    assert r.usage.prompt_tokens > 0


def test_embeddings_base64(server: Server) -> None:
    r = httpx.post(
        server.base_url + "/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": "hello", "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    vec = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(vec) == 384
    assert abs(sum(x * x for x in vec) - 1.0) < 1e-3  # MiniLM output is normalised


def test_health_and_metrics(server: Server) -> None:
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.base_url + "/metrics").text
    assert "loopstack_requests_total" in text
    assert "vllm:num_requests_running" in text  # vLLM's own metric names pass through


def test_auth_required(server: Server) -> None:
    wrong = OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(Exception) as exc:
        wrong.models.list()
    assert getattr(exc.value, "status_code", None) == 401
    r = httpx.get(server.base_url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    ok = httpx.get(server.base_url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
