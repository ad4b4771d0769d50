"""Exceptions raised by the serving package, and how each maps onto an HTTP answer.

Tree::

    ServingError                  (500 unless a subclass says otherwise)
    ├── ModelResolutionError      the model could not be found, fetched or converted
    ├── EngineError               the inference engine failed or is not running (503)
    │   └── EngineStartError      it never became healthy
    ├── RequestError              the client's fault: a 4xx with an OpenAI-style body
    │   ├── InvalidRequest        400 invalid_request_error (bad parameter, bad schema, ...)
    │   ├── AuthenticationFailed  401
    │   ├── ModelNotFound         404 model_not_found
    │   └── Overloaded            429, with Retry-After
    └── ToolCallValidationError   the engine produced arguments that fail the schema (502:
                                  never shown to a client as a valid call)
"""

from __future__ import annotations


class ServingError(Exception):
    status_code: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status_code,
            }
        }


class ModelResolutionError(ServingError):
    pass


class EngineError(ServingError):
    status_code = 503
    error_type = "engine_error"


class EngineStartError(EngineError):
    pass


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

    def __init__(self, model: str):
        super().__init__(
            f"The model `{model}` does not exist.", param="model", code="model_not_found"
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
