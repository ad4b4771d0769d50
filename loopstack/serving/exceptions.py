"""Exceptions raised by the serving package, and how each maps onto an HTTP answer.

Tree::

    ServingError                  (500 unless a subclass says otherwise)
    ├── ModelResolutionError      the model could not be found, fetched or converted
    ├── EngineError               the inference engine failed or is not running (503)
    │   ├── EngineUnavailable     it is (re)starting: 503 with Retry-After
    │   └── EngineStartError      it never became healthy
    │       └── EnginePortInUse   its port is held by a process we did not start
    ├── UpstreamError             the engine answered with an error: its 4xx is passed on,
    │                             anything else becomes 502 engine_error
    ├── RequestError              the client's fault: a 4xx with an OpenAI-style body
    │   ├── InvalidRequest        400 invalid_request_error (bad parameter, bad schema, ...)
    │   ├── AuthenticationFailed  401
    │   ├── ModelNotFound         404 model_not_found
    │   ├── PayloadTooLarge       413 request_too_large (body over LOOPSTACK_MAX_REQUEST_BYTES)
    │   └── Overloaded            429, with Retry-After
    └── ToolCallValidationError   the engine produced arguments that fail the schema (502:
        │                         never shown to a client as a valid call)
        └── ConstrainedGenerationError  the engine failed (5xx) while generating under a
                                  constraint: 502 too, the mapping written once here
                                  (`constrained_generation`, as httpx maps its transport's
                                  errors onto its own tree)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def error_body(
    message: str, *, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    """The one OpenAI-style error body every answer uses:
    ``{"error": {"message", "type", "param", "code"}}``.

    ``code`` is a string or null, as OpenAI's is (openai-python's ``APIError.code`` is
    ``Optional[str]``, Codex reads it as ``Option<String>``: an integer there fails its
    parse); the HTTP status is the answer's own, never repeated in the body.

    Text that cannot be encoded as UTF-8 (a lone surrogate echoed from the request) is
    escaped, so building the response can never fail."""
    return {
        "error": {
            "message": _utf8_safe(message),
            "type": type_,
            "param": None if param is None else _utf8_safe(param),
            "code": code,
        }
    }


def _utf8_safe(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class ServingError(Exception):
    status_code: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, type_=self.error_type, code=self.code, param=self.param)


class ModelResolutionError(ServingError):
    pass


class EngineError(ServingError):
    status_code = 503
    error_type = "engine_error"


class EngineUnavailable(EngineError):
    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message, code="engine_unavailable")
        self.retry_after_s = retry_after_s


class EngineStartError(EngineError):
    pass


class EnginePortInUse(EngineStartError):
    pass


class UpstreamError(ServingError):
    """The engine answered with an error; we pass on its status (4xx) and message."""

    def __init__(self, status_code: int, body: dict[str, Any]):
        err = body.get("error", body) if isinstance(body, dict) else {}
        message = str(err.get("message", body)) if isinstance(err, dict) else str(err)
        code = err.get("code") if isinstance(err, dict) else None  # vLLM's is its status
        super().__init__(
            message,
            param=err.get("param") if isinstance(err, dict) else None,
            code=code if isinstance(code, str) else None,
        )
        self.status_code = status_code if 400 <= status_code < 500 else 502
        self.error_type = "invalid_request_error" if status_code < 500 else "engine_error"


class RequestError(ServingError):
    status_code = 400
    error_type = "invalid_request_error"


class InvalidRequest(RequestError):
    pass


class AuthenticationFailed(RequestError):
    status_code = 401
    error_type = "authentication_error"


class ModelNotFound(RequestError):
    status_code = 404
    error_type = "invalid_request_error"

    def __init__(self, model: str, *, served: list[str] | None = None):
        message = f"The model `{model}` does not exist."
        if served:
            message += (
                f" This server serves: {', '.join(f'`{s}`' for s in served)}"
                " (an operator can map other names onto it: LOOPSTACK_MODEL_ALIASES)."
            )
        super().__init__(message, param="model", code="model_not_found")


class PayloadTooLarge(RequestError):
    status_code = 413

    def __init__(self, limit: int):
        super().__init__(
            f"The request body is larger than {limit} bytes (LOOPSTACK_MAX_REQUEST_BYTES).",
            code="request_too_large",
        )


class Overloaded(RequestError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message, code="overloaded")
        self.retry_after_s = retry_after_s


class ToolCallValidationError(ServingError):
    status_code = 502
    error_type = "tool_call_validation_error"


class ConstrainedGenerationError(ToolCallValidationError):
    """The engine failed while generating under a tool or client constraint."""


@contextlib.contextmanager
def constrained_generation(what: str, *, hint: str = "") -> Iterator[None]:
    """Map an engine failure while generating under `what` (a constraint) onto the tree:
    the engine's 4xx passes as it is (`UpstreamError`), a 5xx becomes a 502
    `ConstrainedGenerationError` - most often the engine could not compile the constraint.
    `hint`: what the client can do about it."""
    try:
        yield
    except UpstreamError as exc:
        if exc.status_code < 500:
            raise
        said = f"{hint}. Engine said: " if hint else ": "
        raise ConstrainedGenerationError(
            f"the engine failed while generating under {what}{said}{exc.message}"
        ) from exc
