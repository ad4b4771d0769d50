"""``POST /v1/responses`` and ``GET``/``DELETE /v1/responses/{id}``: their own router,
included by `loopstack.serving.http.app.build_app`.

A request is translated (`loopstack.serving.http.responses.translate`) into the one chat request and
goes through the one pipeline (`loopstack.serving.http.pipeline.serve`) as chat completions does:
the same model check, limits, session, context fit, admission slot, `ChatService.turn` (the same
selection defaults, constraint and guarantee), keepalive and in-band errors; the encoder
(`loopstack.serving.http.responses.encoder`) writes the Response events. The store
(`loopstack.serving.http.responses.store`) is ``app.state.responses_store``, set by
`loopstack.serving.server.create_app`; an app built without one (tests) gets an in-memory SQLite
store on first use.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from loopstack.serving.exceptions import InvalidRequest, RequestError
from loopstack.serving.http.cancellation import with_cancellation
from loopstack.serving.http.pipeline import check_model, serve
from loopstack.serving.http.responses.encoder import ResponsesEncoder
from loopstack.serving.http.responses.protocol import ResponsesRequest, new_id
from loopstack.serving.http.responses.store import ResponseStore, SqliteStore, Stored, owner_of
from loopstack.serving.http.responses.translate import to_chat
from loopstack.serving.http.state import ERROR_RESPONSES, app_state

logger = logging.getLogger(__name__)

router = APIRouter()


class ResponseNotFound(RequestError):
    status_code = 404

    def __init__(self, id_: str) -> None:
        super().__init__(
            f"No response found with id '{id_[:200]}'.", param="response_id", code="not_found"
        )


def response_store(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "responses_store", None)
    if store is None:
        store = request.app.state.responses_store = SqliteStore(":memory:")
    return store  # type: ignore[no-any-return]


def request_owner(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return owner_of(key or request.headers.get("x-api-key") or None)


@router.post("/v1/responses", responses=ERROR_RESPONSES)
@with_cancellation
async def create_response(req: ResponsesRequest, request: Request) -> Response:
    state = app_state(request)
    check_model(state, req.model)
    store, owner = response_store(request), request_owner(request)
    earlier: list[dict[str, Any]] = []
    if req.previous_response_id:
        prev = await store.get(owner, req.previous_response_id)
        if prev is None:
            raise InvalidRequest(
                f"Previous response with id '{req.previous_response_id[:200]}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        earlier = prev.history
    tr = to_chat(req, earlier, grammars=state.chat.backend.name == "guidance")
    id_ = new_id("resp")

    async def keep(response: dict[str, Any]) -> None:
        """Store the answer (before its last event goes out, so a chain can follow at once);
        a store that fails costs the chain, not the answer: said in its notes."""
        if not req.stores:
            return
        try:
            await store.put(owner, Stored(response, [*tr.history, *response["output"]]))
        except Exception as exc:  # the database is down or full
            logger.exception("response %s not stored", response["id"])
            notes = response.setdefault("loopstack", {}).setdefault("notes", [])
            notes.append(f"not stored: {type(exc).__name__}")

    encoder = ResponsesEncoder(req, tr, id_=id_, on_done=keep)
    headers = {"x-loopstack-notes": " | ".join(tr.notes)} if tr.notes else {}
    user = req.prompt_cache_key or req.user
    return await serve(state, request, encoder, tr.chat, user=user, headers=headers)


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def get_response(response_id: str, request: Request) -> Response:
    found = await response_store(request).get(request_owner(request), response_id)
    if found is None:
        raise ResponseNotFound(response_id)
    return JSONResponse(found.response)


@router.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, request: Request) -> Response:
    if not await response_store(request).delete(request_owner(request), response_id):
        raise ResponseNotFound(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
