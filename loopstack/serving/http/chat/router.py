"""The OpenAI routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, ``/health`` and ``/metrics`` on one module-level router whose handlers read
the service objects from ``request.app.state`` (the shape of vLLM's
``vllm/entrypoints/openai/api_server.py``).

A generating handler checks the model, then hands its request to the pipeline
(`loopstack.serving.http.pipeline`) with its encoder (`loopstack.serving.http.chat.encoder`); a
client that leaves cancels it (`with_cancellation`). `loopstack.serving.http.app.build_app` includes
`router`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from loopstack.serving.embeddings import MINILM_NAMES
from loopstack.serving.engine.transport import ENGINE_RETRY_AFTER_S
from loopstack.serving.exceptions import ModelNotFound
from loopstack.serving.http.cancellation import with_cancellation
from loopstack.serving.http.chat.encoder import ChatEncoder
from loopstack.serving.http.codex_catalogue import codex_model_info
from loopstack.serving.http.context_fit import clamped, fit_completion
from loopstack.serving.http.limits import check_completion, check_embeddings
from loopstack.serving.http.pipeline import bind_session, check_model, generate, serve
from loopstack.serving.http.service import Turn
from loopstack.serving.http.state import ERROR_RESPONSES, app_state
from loopstack.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

__all__ = ["router"]

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    ok = await app_state(request).engine.healthy()
    headers = None if ok else {"Retry-After": str(ENGINE_RETRY_AFTER_S)}
    return JSONResponse(
        {"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503,
        headers=headers,
    )  # fmt: skip


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    ours = state.metrics.render().decode()
    return PlainTextResponse(ours + await state.engine.metrics_text())


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = app_state(request)
    now = int(time.time())
    llm: dict[str, Any] = {"id": state.model_name, "object": "model", "created": now}
    llm.update(owned_by="loopstack", max_model_len=state.max_model_len)
    emb = {"id": state.embeddings.model_name, "object": "model", "created": now}
    emb["owned_by"] = "loopstack"
    # `models`: Codex's catalogue (`GET {base_url}/models`), beside `data` for the openai SDK
    return {"object": "list", "data": [llm, emb], "models": [codex_model_info(state)]}


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
@with_cancellation
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    state = app_state(request)
    check_model(state, req.model)
    encoder = ChatEncoder(req.model, include_usage=req.include_usage)
    user = (req.model_extra or {}).get("user")
    return await serve(state, request, encoder, req, user=user)


@router.post("/v1/completions", responses=ERROR_RESPONSES)
@with_cancellation
async def completions(req: CompletionRequest, request: Request) -> Response:
    state = app_state(request)
    check_model(state, req.model)
    check_completion(req, state.limits, state.max_model_len)
    bind_session(request, (req.model_extra or {}).get("user"))
    req, asked = fit_completion(req, state.chat.prompts, state.max_model_len)
    body = req.model_dump(exclude_none=True)
    body["model"] = state.engine.model_name

    async def turn() -> Turn:  # client constraints: probed or 400; then relayed
        return Turn(passed=await state.chat.completion(body))

    headers = clamped(asked, req.max_tokens)
    return await generate(state, ChatEncoder(req.model), turn, stream=bool(req.stream),
                          headers=headers)  # fmt: skip


@router.post("/v1/embeddings", responses=ERROR_RESPONSES)
async def embeddings(req: EmbeddingRequest, request: Request) -> dict[str, Any]:
    state = app_state(request)
    if req.model != state.embeddings.model_name and not (
        req.model in MINILM_NAMES and state.embeddings.model_name in MINILM_NAMES
    ):
        raise ModelNotFound(req.model)
    texts = check_embeddings(req, state.limits)
    async with state.admission.slot():
        return await state.embeddings.create(req, texts)
