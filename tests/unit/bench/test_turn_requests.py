"""The warm step's unconstrained twin in ``loopstack.bench.serving.turn_requests`` (no server)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from loopstack.bench.serving.turn_requests import WEATHER, twin_line, twin_steps


def _client(bodies: list[dict[str, Any]]) -> httpx.Client:
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with lock:
            bodies.append(body)
        twin = body.get("ignore_eos") is True
        tokens = body["max_tokens"] if twin else 23
        return httpx.Response(200, json={"choices": [], "usage": {"completion_tokens": tokens}})

    return httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler))


def test_the_twin_decodes_what_the_constrained_turn_wrote_without_a_grammar() -> None:
    bodies: list[dict[str, Any]] = []
    t = twin_steps(_client(bodies), "m", [WEATHER], pairs=3, agents=2)
    prime, *rest = bodies
    assert "loopstack" not in prime and prime["tool_choice"] == "required"
    twins = [b for b in rest if b.get("loopstack")]
    assert len(twins) == 6 and len(rest) == 12
    for b in twins:  # the same request, constraint off, exactly the constrained turn's tokens
        assert b["loopstack"] == {"constrained": False}
        assert b["ignore_eos"] is True and b["max_tokens"] == 23
        assert b["messages"] == prime["messages"] and b["tools"] == prime["tools"]
    assert t["pairs"] == 6 and t["tokens"] == 23 and t["same_tokens"] == 6
    assert t["paired_min_median_max"][0] > 0
    assert "2 agent(s), 6 pairs" in twin_line(t)


def test_the_order_inside_a_pair_alternates() -> None:
    bodies: list[dict[str, Any]] = []
    twin_steps(_client(bodies), "m", [WEATHER], pairs=2, agents=1)
    firsts = [bool(bodies[i].get("loopstack")) for i in (1, 3)]
    assert firsts == [False, True]  # constrained first, then the twin first
