"""Limits at the HTTP edge: what one request may ask of the server, checked before any work.

Two layers:

* `EdgeGuard`, a pure ASGI middleware, runs before routing and parsing: it checks the API key
  (constant-time; ``Authorization: Bearer`` or Anthropic's ``x-api-key``) on ``/v1/*``
  *before the body is read*, and reads the body itself, counting
  bytes, so a body over `Limits.max_request_bytes` is answered 413 without ever being held
  whole in memory or parsed.
* `check_chat` / `check_completion` / `check_embeddings` run on the parsed request, before
  admission: counts (messages, tools, stop strings, prompts, embedding inputs) and
  ``max_tokens`` above what the context leaves is lowered, not refused
  (`loopstack.serving.http.context_fit`).

Every refusal is an OpenAI-style error body built by `loopstack.serving.exceptions.error_body`.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopstack.serving.config import setting_default
from loopstack.serving.exceptions import (
    AuthenticationFailed,
    InvalidRequest,
    PayloadTooLarge,
    RequestError,
)
from loopstack.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

logger = logging.getLogger(__name__)

_BODY_METHODS = {"POST", "PUT", "PATCH"}


@dataclass(frozen=True)
class Limits:
    """The configurable bounds (the ``LOOPSTACK_MAX_*`` settings of the same names, unpacked
    in `loopstack.serving.server`; their defaults declared there, in `ServerSettings`)."""

    max_request_bytes: int = setting_default("max_request_bytes")
    max_messages: int = setting_default("max_messages")
    max_tools: int = setting_default("max_tools")
    max_stop: int = setting_default("max_stop")
    max_prompts: int = setting_default("max_prompts")
    max_embedding_inputs: int = setting_default("max_embedding_inputs")
    max_embedding_input_chars: int = setting_default("max_embedding_input_chars")


# --------------------------------------------------------------------------- parsed requests
def check_chat(req: ChatCompletionRequest, limits: Limits, max_model_len: int | None) -> None:
    if len(req.messages) > limits.max_messages:
        raise InvalidRequest(
            f"at most {limits.max_messages} messages per request (LOOPSTACK_MAX_MESSAGES); "
            f"got {len(req.messages)}",
            param="messages",
            code="too_many_messages",
        )
    if req.tools is not None and len(req.tools) > limits.max_tools:
        raise InvalidRequest(
            f"at most {limits.max_tools} tools per request (LOOPSTACK_MAX_TOOLS); "
            f"got {len(req.tools)}",
            param="tools",
            code="too_many_tools",
        )
    _check_stop(req.stop, limits)


def check_completion(req: CompletionRequest, limits: Limits, max_model_len: int | None) -> None:
    prompts = req.prompt if isinstance(req.prompt, list) else [req.prompt]
    if prompts and isinstance(prompts[0], int):
        prompts = [prompts]  # one prompt as token ids
    if len(prompts) > limits.max_prompts:
        raise InvalidRequest(
            f"at most {limits.max_prompts} prompts per request (LOOPSTACK_MAX_PROMPTS); "
            f"got {len(prompts)}",
            param="prompt",
            code="too_many_prompts",
        )
    _check_stop(req.stop, limits)


def check_embeddings(req: EmbeddingRequest, limits: Limits) -> list[str]:
    """The inputs to embed, each cut to `max_embedding_input_chars` (the model reads only its
    first few hundred tokens anyway); too many inputs is a 400."""
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if len(texts) > limits.max_embedding_inputs:
        raise InvalidRequest(
            f"at most {limits.max_embedding_inputs} inputs per request "
            f"(LOOPSTACK_MAX_EMBEDDING_INPUTS); got {len(texts)}",
            param="input",
            code="too_many_inputs",
        )
    if any(not t for t in texts):
        raise InvalidRequest("each input must be a non-empty string", param="input")
    return [t[: limits.max_embedding_input_chars] for t in texts]


def _check_stop(stop: str | list[str] | None, limits: Limits) -> None:
    if isinstance(stop, list) and len(stop) > limits.max_stop:
        raise InvalidRequest(
            f"at most {limits.max_stop} stop sequences (LOOPSTACK_MAX_STOP); got {len(stop)}",
            param="stop",
        )


# --------------------------------------------------------------------------- ASGI middleware
def key_matches(configured: str, header: str) -> bool:
    """Whether an ``Authorization`` header carries `configured` as its bearer token.

    Constant-time; an empty token never matches (so an empty configured key locks the API
    instead of letting a bare ``Bearer`` in)."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not configured:
        return False
    return hmac.compare_digest(token.encode("utf-8", "replace"), configured.encode("utf-8"))


class EdgeGuard:
    """API key before the body, then the body read with a byte limit (413), then the app.

    The body is handed on as one message; later ``receive`` calls go to the server, so the
    app still sees the client's disconnect (generations are aborted on it)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_request_bytes: int):
        self.app = app
        self.api_key = api_key
        self.max_bytes = max_request_bytes
        if api_key is not None and not api_key.strip():
            logger.warning("LOOPSTACK_API_KEY is set but empty: every /v1 request will get 401")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and path.startswith("/v1/"):
            header = headers.get(b"authorization", b"").decode("latin-1")
            x_api_key = headers.get(b"x-api-key", b"").decode("latin-1")  # Anthropic's clients
            if not key_matches(self.api_key, header) and not key_matches(
                self.api_key, f"Bearer {x_api_key}"
            ):
                exc = AuthenticationFailed("Incorrect API key provided.", code="invalid_api_key")
                await _answer(exc, scope, receive, send)
                return
        if scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _answer(PayloadTooLarge(self.max_bytes), scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _answer(PayloadTooLarge(self.max_bytes), scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _answer(exc: RequestError, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(exc.to_body(), status_code=exc.status_code)
    await response(scope, receive, send)
