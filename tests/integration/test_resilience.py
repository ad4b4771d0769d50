"""Overload gets 429 + Retry-After; a client that hangs up aborts its generation in vLLM."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import (
    API_KEY,
    Server,
    free_port,
    start_server,
    stop,
    wait_healthy,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def running_in_vllm(server: Server) -> float:
    text = httpx.get(server.engine_url + "/metrics", timeout=10).text
    m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert m, "vllm:num_requests_running missing"
    return float(m.group(1))


def wait_idle(server: Server, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running_in_vllm(server) == 0:
            return True
        time.sleep(0.25)
    return False


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_client_disconnect_aborts_generation(server: Server, stream: bool) -> None:
    assert wait_idle(server)
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": stream,
    }
    url = server.base_url + "/v1/chat/completions"
    if stream:
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=60) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i > 3:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, headers=AUTH, timeout=4)
    # 2000 tokens take minutes on a CPU; an aborted request is gone within seconds.
    assert wait_idle(server, timeout=20), "generation kept running after the client left"


@pytest.fixture(scope="module")
def tight_server(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second loopstack layer on the same vLLM, admitting 1 request and queueing none."""
    port = free_port()
    log = tmp_path_factory.mktemp("tight") / "server.log"
    proc = start_server(
        log,
        {
            "LOOPSTACK_API_KEY": API_KEY,
            "LOOPSTACK_ENGINE_URL": server.engine_url,
            "LOOPSTACK_SERVED_MODEL_NAME": server.model,
            "LOOPSTACK_MAX_CONCURRENCY": "1",
            "LOOPSTACK_MAX_QUEUE": "0",
            "LOOPSTACK_RETRY_AFTER_S": "3",
        },
        port,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log, 300)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def test_overload_gets_429_with_retry_after(server: Server, tight_server: str) -> None:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 2000,
        "ignore_eos": True,
    }
    url = tight_server + "/v1/chat/completions"
    # The first request holds the only slot: it streams, and the second is sent only once the
    # first has produced a chunk, so a fast machine cannot finish it before the second arrives.
    with httpx.stream(
        "POST", url, json={**body, "stream": True}, headers=AUTH, timeout=300
    ) as first:
        assert first.status_code == 200
        lines = first.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        r = httpx.post(url, json={**body, "max_tokens": 8}, headers=AUTH, timeout=60)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["type"] == "rate_limit_error"
    # Hanging up on the first frees the slot; the next request is admitted.
    assert wait_idle(server, timeout=30)
    deadline = time.monotonic() + 30
    while True:
        again = httpx.post(url, json={**body, "max_tokens": 8}, headers=AUTH, timeout=120)
        if again.status_code != 429 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.status_code == 200, again.text
