"""What the handlers serve with (`AppState`, on ``app.state.loopstack``) and the error bodies
every route declares in the OpenAPI document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import Request

from loopstack.serving.embeddings import EmbeddingService
from loopstack.serving.engine.supervisor import Engine
from loopstack.serving.http.admission import Admission
from loopstack.serving.http.limits import Limits
from loopstack.serving.http.service import ChatService
from loopstack.serving.metrics import Metrics

__all__ = ["ERROR_RESPONSES", "AppState", "app_state"]

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": what, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for status, what in [
        (400, "Invalid request"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (429, "Overloaded; see Retry-After"),
    ]
}


@dataclass
class AppState:
    """What the handlers serve with; `loopstack.serving.http.app.build_app` puts it on
    ``app.state``."""

    engine: Engine
    chat: ChatService
    embeddings: EmbeddingService
    metrics: Metrics
    admission: Admission
    model_name: str
    api_key: str | None = None
    max_model_len: int | None = None
    limits: Limits = field(default_factory=Limits)
    model_aliases: dict[str, str] = field(default_factory=dict)  # LOOPSTACK_MODEL_ALIASES
    anthropic_model_names: bool = True  # claude-* on /v1/messages (loopstack.serving.http.aliases)


def app_state(request: Request) -> AppState:
    """The `AppState` of the app serving `request`."""
    return cast(AppState, request.app.state.loopstack)
