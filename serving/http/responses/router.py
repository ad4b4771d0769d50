"""``POST /v1/responses`` and ``GET``/``DELETE /v1/responses/{id}``: their own router,
included by `serving.api.build_app`.

A request goes the chat endpoint's way: the model and the edge limits checked (`check_chat`
on the translated request), one admission slot for the whole generation (`_generate`, the
stream keeping it until it ends), `ChatService.create` (constraint backend, guarantee,
metrics), a client that leaves cancels it (`with_cancellation`); errors are the app's
OpenAI error bodies. Only the shape differs (`serving.http.responses.translate`,
`serving.http.responses.encoder`). The store (`serving.http.responses.store`) is
``app.state.responses_store``, set by `serving.server.create_app`; an app built without one
(tests) gets an in-memory SQLite store on first use.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from serving.exceptions import InvalidRequest, RequestError
from serving.http.service import Answer, wire_headers
from serving.http.context_fit import clamped, fit_chat
from serving.http.limits import check_chat
from serving.http.responses.translate import to_chat, whole_response
from serving.http.responses.protocol import ResponsesRequest, new_id
from serving.http.responses.store import ResponseStore, SqliteStore, Stored, owner_of
from serving.http.responses.encoder import ResponseEvents
from serving.http.chat.router import (
    ERROR_RESPONSES,
    _check_model,
    _generate,
    app_state,
    bind_session,
    with_cancellation,
)

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
    _check_model(state, req.model)
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
    check_chat(tr.chat, state.limits, state.max_model_len)
    bind_session(request, {"user": req.prompt_cache_key or req.user})
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

    async def run() -> Answer:
        fit = await fit_chat(tr.chat, state.chat, state.max_model_len)  # max_tokens lowered
        answer = await state.chat.create(fit.request, server_defaults=False)
        headers = {**answer.headers, **clamped(fit.asked, fit.given)}
        result = answer.body
        if isinstance(result, dict):
            response = whole_response(req, tr, result, id_=id_)
            await keep(response)
            return Answer(response, headers)
        return Answer(ResponseEvents(req, tr, id_=id_, on_done=keep).run(result), headers)

    reply = await _generate(state, run)
    if tr.notes:
        reply.headers.update(wire_headers({"x-loopstack-notes": " | ".join(tr.notes)}))
    return reply


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
