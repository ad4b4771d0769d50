"""Stored responses: previous_response_id chains, GET/DELETE, scoped by API key, bounded,
durable across a restart (two apps on one SQLite file) and shared by replicas (two apps on
one real PostgreSQL, loopstack/bench/memory/local_postgres.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.serving.http.responses.store import (
    PostgresStore,
    SqliteStore,
    Stored,
    StoreLimits,
    open_store,
    owner_of,
)
from tests.unit.serving.responses_helpers import FN_WEATHER, create, engine_messages, events
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import PARIS, assert_openai_error, call

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    with LocalPostgres(fsync=False) as pg:
        yield pg


async def _call_then_answer(h: Harness, **kw: Any) -> dict[str, Any]:
    h.engine.constrained = [call("get_weather", PARIS)]
    first = (await create(h, tools=[FN_WEATHER], instructions="FIRST RULES", **kw)).json()
    assert first["output"][0]["type"] == "function_call", first
    return first


def _tool_output(first: dict[str, Any]) -> list[dict[str, Any]]:
    call_id = first["output"][0]["call_id"]
    return [{"type": "function_call_output", "call_id": call_id, "output": "SUNNY 21"}]


async def test_previous_response_id_rebuilds_the_chain(harness: Harness) -> None:
    first = await _call_then_answer(harness)
    harness.engine.constrained = ["It is sunny."]
    resp = await create(
        harness, input=_tool_output(first), tools=[FN_WEATHER], previous_response_id=first["id"]
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["previous_response_id"] == first["id"]
    prompt = engine_messages(harness)
    order = ["What is the weather in Paris?", "<tool_call>", "SUNNY 21"]
    at = [prompt.index(s) for s in order]
    assert at == sorted(at), prompt
    assert "FIRST RULES" not in prompt  # instructions are not carried along a chain


async def test_a_streamed_response_is_stored_before_completed(harness: Harness) -> None:
    harness.engine.constrained = [call("get_weather", PARIS)]
    resp = await create(harness, stream=True, tools=[FN_WEATHER])
    final = events(resp.text)[-1]["response"]
    got = await harness.client.get(f"/v1/responses/{final['id']}")
    assert got.status_code == 200 and got.json()["output"] == final["output"]


async def test_get_and_delete(harness: Harness) -> None:
    first = await _call_then_answer(harness)
    got = await harness.client.get(f"/v1/responses/{first['id']}")
    assert got.status_code == 200 and got.json() == first
    gone = await harness.client.delete(f"/v1/responses/{first['id']}")
    assert gone.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert_openai_error(await harness.client.get(f"/v1/responses/{first['id']}"), 404)
    assert_openai_error(await harness.client.delete(f"/v1/responses/{first['id']}"), 404)
    again = await create(harness, input="more", previous_response_id=first["id"])
    assert assert_openai_error(again, 400)["code"] == "previous_response_not_found"


async def test_store_false_keeps_nothing(harness: Harness) -> None:
    first = await _call_then_answer(harness, store=False)
    assert first["store"] is False
    assert_openai_error(await harness.client.get(f"/v1/responses/{first['id']}"), 404)


async def test_responses_are_scoped_by_api_key(harness: Harness) -> None:
    harness.engine.chat_content = "hi"
    mine = {"authorization": "Bearer key-a"}
    resp = await harness.client.post(
        "/v1/responses", json={"model": "test-model", "input": "x"}, headers=mine
    )
    rid = resp.json()["id"]
    assert (await harness.client.get(f"/v1/responses/{rid}", headers=mine)).status_code == 200
    other = {"authorization": "Bearer key-b"}
    assert_openai_error(await harness.client.get(f"/v1/responses/{rid}", headers=other), 404)
    assert_openai_error(await harness.client.delete(f"/v1/responses/{rid}", headers=other), 404)
    chained = await harness.client.post(
        "/v1/responses",
        json={"model": "test-model", "input": "y", "previous_response_id": rid},
        headers=other,
    )
    assert_openai_error(chained, 400)
    assert owner_of("key-a") != owner_of("key-b") and owner_of(None) == ""


async def test_a_chain_survives_a_restart(
    make_harness: Callable[..., Harness], tmp_path: Path
) -> None:
    path = tmp_path / "responses.sqlite3"
    before = make_harness()
    before.app.state.responses_store = SqliteStore(path)
    first = await _call_then_answer(before)
    before.app.state.responses_store.close()
    after = make_harness()  # a new process's app over the same file
    after.app.state.responses_store = SqliteStore(path)
    after.engine.constrained = ["It is sunny."]
    resp = await create(
        after, input=_tool_output(first), tools=[FN_WEATHER], previous_response_id=first["id"]
    )
    assert resp.status_code == 200, resp.text
    assert '<tool_call>\n{"name": "get_weather"' in engine_messages(after)
    assert (await after.client.get(f"/v1/responses/{first['id']}")).json() == first


async def test_two_replicas_share_one_postgres(
    make_harness: Callable[..., Harness], postgres: LocalPostgres
) -> None:
    url = postgres.new_schema()
    a, b = make_harness(), make_harness()
    a.app.state.responses_store = open_store(url, Path("/nonexistent"))
    b.app.state.responses_store = open_store(url, Path("/nonexistent"))
    assert isinstance(b.app.state.responses_store, PostgresStore)
    first = await _call_then_answer(a)
    b.engine.constrained = ["It is sunny."]
    resp = await create(
        b, input=_tool_output(first), tools=[FN_WEATHER], previous_response_id=first["id"]
    )
    assert resp.status_code == 200, resp.text
    assert '<tool_call>\n{"name": "get_weather"' in engine_messages(b)
    second = resp.json()["id"]
    assert (await a.client.get(f"/v1/responses/{second}")).json() == resp.json()
    assert (await b.client.delete(f"/v1/responses/{first['id']}")).status_code == 200
    assert_openai_error(await a.client.get(f"/v1/responses/{first['id']}"), 404)
    # the later response carries the whole chain: it goes on though the first is gone
    a.engine.constrained = ["Still sunny."]
    third = await create(a, input="and tomorrow?", previous_response_id=second)
    assert third.status_code == 200 and "SUNNY 21" in engine_messages(a)


def _stored(n: int, size: int = 10) -> Stored:
    return Stored({"id": f"resp_{n}", "output": ["x" * size]}, [])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_store_is_bounded(kind: str, tmp_path: Path, request: Any) -> None:
    def make(limits: StoreLimits) -> Any:
        if kind == "sqlite":
            return SqliteStore(tmp_path / f"{time.monotonic_ns()}.sqlite3", limits)
        return PostgresStore(request.getfixturevalue("postgres").new_schema(), limits)

    few = make(StoreLimits(max_items=3))
    for n in range(5):
        await few.put("o", _stored(n))
    assert [await few.get("o", f"resp_{n}") is not None for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    young = make(StoreLimits(max_age_s=0.2))
    await young.put("o", _stored(1))
    assert await young.get("o", "resp_1") is not None
    await asyncio.sleep(0.3)
    assert await young.get("o", "resp_1") is None
    small = make(StoreLimits(max_bytes=100))
    await small.put("o", _stored(1, size=500))
    assert await small.get("o", "resp_1") is None


async def test_open_store_picks_by_url(tmp_path: Path) -> None:
    assert isinstance(open_store(None, tmp_path), SqliteStore)
    assert (tmp_path / "responses.sqlite3").exists()
    assert isinstance(open_store(str(tmp_path / "x.db"), tmp_path), SqliteStore)
    assert (tmp_path / "x.db").exists()


async def test_models_carries_codex_catalogue(harness: Harness) -> None:
    body = (await harness.client.get("/v1/models")).json()
    assert body["data"][0]["id"] == "test-model"  # the openai SDK's shape
    [info] = body["models"]
    assert info["slug"] == "test-model" and info["apply_patch_tool_type"] == "freeform"
    assert {"base_instructions", "truncation_policy", "shell_type", "visibility"} <= info.keys()


async def test_a_failing_store_costs_the_chain_not_the_answer(harness: Harness) -> None:
    class Broken(SqliteStore):
        async def put(self, owner: str, stored: Stored) -> None:
            raise OSError("disk full")

    harness.app.state.responses_store = Broken(":memory:")
    harness.engine.chat_content = "hi"
    whole = await create(harness)
    assert whole.status_code == 200 and whole.json()["loopstack"]["notes"] == [
        "not stored: OSError"
    ]
    streamed = events((await create(harness, stream=True)).text)
    assert streamed[-1]["type"] == "response.completed"
    assert streamed[-1]["response"]["loopstack"]["notes"] == ["not stored: OSError"]
