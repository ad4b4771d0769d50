"""More wire APIs plug into the one app: `build_app(state, routers=[...])` serves their routes
behind the same auth, trace ids and error bodies."""

from __future__ import annotations

import httpx
from fastapi import APIRouter

from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.app import build_app
from tests.unit.serving.serving_fakes import Harness

extra = APIRouter()


@extra.post("/v1/extra")
async def extra_route(body: dict[str, int]) -> dict[str, int]:
    if body.get("n", 0) < 0:
        raise InvalidRequest("n must not be negative", param="n")
    return {"twice": 2 * body.get("n", 0)}


async def test_an_extra_router_is_served_like_the_others() -> None:
    h = Harness(api_key="k")
    app = build_app(h.state, routers=[extra])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        auth = {"Authorization": "Bearer k"}
        assert (await client.post("/v1/extra", json={"n": 2}, headers=auth)).json() == {"twice": 4}
        assert (await client.post("/v1/extra", json={"n": 2})).status_code == 401
        bad = await client.post("/v1/extra", json={"n": -1}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
        assert bad.headers["x-request-id"]  # the trace id, as on every answer
