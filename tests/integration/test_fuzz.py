"""Property-based fuzz of the live API from its own OpenAPI document (schemathesis 4): valid
and invalid bodies for every operation; the server must never answer 5xx.

Bodies are tamed only where the model's time goes (``max_tokens`` 1, ``n`` 1, strings cut to 64
characters and lists to 8 items, so prompts stay short) and where a
random value would stop every case at the door (``model`` is set to the served one in most
examples), so generated requests reach the handlers, the engine and back.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import API_KEY, Server

schemathesis = pytest.importorskip("schemathesis")

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES = {  # per operation; LOOPSTACK_FUZZ_SCALE multiplies them for longer local runs
    "POST /v1/chat/completions": 40,
    "POST /v1/completions": 25,
    "POST /v1/embeddings": 20,
    "POST /v1/messages": 30,  # Anthropic Messages: its own 4xx envelope, never a 5xx
    "POST /v1/messages/count_tokens": 15,
    "GET /v1/models": 5,
    "GET /health": 3,
    "POST /v1/responses": 30,
    "GET /v1/responses/{response_id}": 4,
    "DELETE /v1/responses/{response_id}": 4,
}
SCALE = float(os.environ.get("LOOPSTACK_FUZZ_SCALE", "1"))
COSTLY = ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")


def shrink(value: Any) -> Any:
    """Strings cut to 64 characters and lists to 8 items (keys kept): generated prompts stay
    short, so the engine's share of each case is one small prefill and one token."""
    if isinstance(value, str):
        return value[:64]
    if isinstance(value, list):
        return [shrink(v) for v in value[:8]]
    if isinstance(value, dict):
        return {k: shrink(v) for k, v in value.items()}
    return value


def tame(body: Any, model: str, embedding_model: str, path: str, keep_model: bool) -> Any:
    if not isinstance(body, dict):
        return body
    body = shrink(body)
    if not keep_model:
        body["model"] = embedding_model if path.endswith("embeddings") else model
    for key in COSTLY:
        if key in body:
            body[key] = 1
    if path.endswith("/responses"):
        body["max_output_tokens"] = 1
    elif not path.endswith("embeddings"):
        body.setdefault("max_tokens", 1)
    if isinstance(body.get("n"), int):
        body["n"] = 1
    body.pop("best_of", None)
    return body


def fuzz(op: Any, examples: int, send: Callable[[Any, str], None]) -> None:
    """`examples` generated cases (valid and invalid) of one operation, each sent once."""
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    strategy = st.one_of(*(op.as_strategy(generation_mode=m) for m in modes))

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a failure reproduces
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, keep_model=st.sampled_from([False, False, False, True]))
    def run(case: Any, keep_model: bool) -> None:
        send(case, "keep" if keep_model else "set")

    run()


def test_fuzz_api_from_openapi(server: Server) -> None:
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json", timeout=30)
    models = httpx.get(server.base_url + "/v1/models", headers=AUTH, timeout=30).json()["data"]
    embedding_model = models[1]["id"]
    statuses: Counter[str] = Counter()
    errors: list[str] = []
    operations = {
        f"{r.ok().method.upper()} {r.ok().path}": r.ok() for r in schema.get_all_operations()
    }
    assert set(operations) >= set(EXAMPLES)
    for label, op in operations.items():
        if label not in EXAMPLES:
            continue

        def send(case: Any, model: str, label: str = label, path: str = op.path) -> None:
            case.body = tame(case.body, server.model, embedding_model, path, model == "keep")
            try:
                resp = case.call(base_url=server.base_url, headers=AUTH, timeout=120)
            except requests.Timeout:  # a slow shared engine, not an answer: counted apart
                statuses[f"{label} timeout"] += 1
                return
            except Exception as exc:  # a dropped connection is a failure
                errors.append(f"{label}: {exc!r} for {str(case.body)[:300]}")
                return
            statuses[f"{label} {resp.status_code}"] += 1
            if resp.status_code >= 500:
                errors.append(
                    f"{label}: {resp.status_code} {resp.text[:300]} for {str(case.body)[:300]}"
                )

        fuzz(op, max(1, int(EXAMPLES[label] * SCALE)), send)
    total = sum(statuses.values())
    print(f"\nfuzz: {total} requests, server errors: {len(errors)}; by status: {dict(statuses)}")
    assert errors == [], errors[:5]
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
    timeouts = sum(n for key, n in statuses.items() if key.endswith("timeout"))
    assert timeouts <= max(2, total // 20), f"{timeouts} requests got no answer in 120 s"
