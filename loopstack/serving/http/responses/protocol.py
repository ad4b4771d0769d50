"""The OpenAI Responses API on the wire: the request model we validate, the shapes we build.

Validated strictly only where loopstack acts on a field; input items and tools are kept as
JSON objects here and read one by one in `loopstack.serving.http.responses.translate` (each client
sends its own variety: the Agents SDK replays its output items unchanged, Codex sends items without
ids, hosted tool types we skip). Whatever the request carries is still sane JSON
(`loopstack.serving.protocol.check_json_values`, through `RequestBase`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from loopstack.serving.protocol import RequestBase

_MAX_TOKENS = 2**31 - 1
MAX_INPUT_ITEMS = 4096  # beyond LOOPSTACK_MAX_MESSAGES anyway; a bound before any work


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (name, schema, strict)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(RequestBase):
    """``POST /v1/responses``."""

    model: str
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=_MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, max_length=200)
    include: list[str] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1000)
    user: str | None = Field(default=None, max_length=1000)
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    background: bool | None = None
    conversation: Any = None  # refused when set: `loopstack.serving.http.responses.refuse_unserved`
    prompt: Any = None  # refused when set, likewise
    loopstack: dict[str, Any] | None = None  # our chat extension, passed on as it is
    # When the request came: the ``created_at`` of its response, read once, so every
    # snapshot of one response (each stream event, the stored object) says the same.
    _received_at: int = PrivateAttr(default_factory=lambda: int(time.time()))

    @property
    def stores(self) -> bool:
        return self.store is not False  # OpenAI's default is true

    @property
    def created_at(self) -> int:
        return self._received_at


# --------------------------------------------------------------------------- ids
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- items
def message_item(text: str, *, id_: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": id_,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    *, id_: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": id_,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def custom_call_item(
    *, id_: str, call_id: str, name: str, input_: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": id_,
        "type": "custom_tool_call",
        "call_id": call_id,
        "name": name,
        "input": input_,
        "status": status,
    }


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """``usage`` as the openai SDK's ``ResponseUsage`` requires it: ``cache_write_tokens``
    is a required field in openai 3.57 (installed here); vLLM counts no cache writes: 0."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    req: ResponsesRequest,
    *,
    id_: str,
    created_at: int | None = None,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The whole Response object, echoing what the request asked for; `created_at`
    defaults to the request's (one value per response, however many snapshots)."""
    fmt = (
        req.text.format.model_dump(by_alias=True, exclude_none=True)
        if (req.text and req.text.format)
        else {"type": "text"}
    )
    body: dict[str, Any] = {
        "id": id_,
        "object": "response",
        "created_at": created_at if created_at is not None else req.created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None},
        "store": req.stores,
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "usage": usage_,
        "user": req.user,
        "metadata": req.metadata or {},
    }
    if notes:
        body["loopstack"] = {"notes": notes}
    return body
