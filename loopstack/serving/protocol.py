"""OpenAI wire format: the request models we validate and the response shapes we build.

Requests are validated strictly where loopstack acts on a field (tools, tool_choice, sampling
ranges) and passed through otherwise (``extra="allow"``), so vLLM-specific knobs such as
``top_k`` or ``ignore_eos`` still reach the engine. Whatever passes through is still sane
JSON (`check_json_values`): finite numbers, integers within 64 bits, valid Unicode, bounded
nesting - the classes of input that used to surface as 500s further in.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_JSON_DEPTH = 128
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_MAX_TOKENS = 2**31 - 1


def check_json_values(value: Any) -> None:
    """Raise ValueError (a 400 at the edge) for JSON the rest of the stack cannot carry:
    NaN / Infinity, integers beyond 64 bits, strings with lone surrogates (not UTF-8),
    nesting deeper than `MAX_JSON_DEPTH`. Iterative, so depth cannot exhaust the stack."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels at {where!r}")
            for key, sub in item.items():
                _check_str(key, f"{where}.{key}" if where else str(key))
                stack.append((sub, f"{where}.{key}" if where else str(key), depth + 1))
        elif isinstance(item, list):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels at {where!r}")
            stack.extend((sub, f"{where}[{i}]", depth + 1) for i, sub in enumerate(item))
        elif isinstance(item, str):
            _check_str(item, where)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                raise ValueError(f"{_safe(where)}: integer out of the 64-bit range")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{_safe(where)}: numbers must be finite (no NaN or Infinity)")


def _check_str(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{_safe(where)}: string is not valid Unicode (lone surrogate)") from None


def _safe(where: str) -> str:
    return where.encode("utf-8", "backslashreplace").decode()[:200]


#: What a model that cannot see images reads where an image was (Messages, Responses).
IMAGE_NOTE = "[an image was attached here; this model cannot see images]"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RequestBase(_Open):
    """A request body: checked as a whole by `check_json_values` before field validation."""

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any) -> Any:
        check_json_values(data)
        return data


class FunctionDef(_Open):
    name: str = Field(pattern=_TOOL_NAME.pattern)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDef(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


ToolChoiceMode = Literal["none", "auto", "required"]


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(_Open):
    """A call the assistant made earlier in the history."""

    name: str
    arguments: str | dict[str, Any] = "{}"

    @field_validator("arguments")
    @classmethod
    def _json_text(cls, v: str | dict[str, Any]) -> str:
        if isinstance(v, dict):  # some clients send the object itself
            return json.dumps(v, ensure_ascii=False)
        if not v.strip():
            return "{}"
        try:
            json.loads(v)
        except ValueError:
            # A call cut by max_tokens (finish_reason "length") has such arguments and clients
            # echo it back: carried as a JSON string so the template renders it, not refused.
            return json.dumps(v, ensure_ascii=False)
        return v


class ToolCallEntry(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(_Open):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={  # what `_tool_needs_id` checks, told to clients and fuzzers
            "if": {"properties": {"role": {"const": "tool"}}, "required": ["role"]},
            "then": {
                "required": ["tool_call_id"],
                "properties": {"tool_call_id": {"type": "string", "minLength": 1}},
            },
        },
    )

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallEntry] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_needs_id(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("messages with role 'tool' must have a tool_call_id")
        return self


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs `json_schema`")
        return self


class ToolRankOptions(BaseModel):
    """``loopstack.tool_rank``: offer the tools ranked by relevance
    (`loopstack.serving.selection.requests`)."""

    model_config = ConfigDict(extra="forbid")

    top_k: int | None = Field(default=None, ge=1, le=1024, description="offer the k best only")
    min_score: float | None = Field(
        default=None, ge=-2.0, le=2.0, description="offer only tools scoring this or more"
    )
    query: str | None = Field(
        default=None, max_length=20_000, description="rank against this (default: first user msg)"
    )
    always: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="tools offered whatever their score, after the ranked ones (not counted "
        "in top_k): an agent's own control tools",
    )


class LoopstackOptions(BaseModel):
    """Our extension, sent as ``extra_body={"loopstack": {...}}``."""

    constrained: bool = Field(
        default=True,
        description="False turns the grammar off for this request (benchmark baseline only).",
    )
    tool_rank: ToolRankOptions | None = Field(
        default=None,
        description="rank the offered tools by relevance, optionally only the best; absent: "
        "the server's default (loopstack.serving.selection.defaults); null or false: no ranking",
    )
    no_repeat: bool = Field(
        default=False,
        description="the grammar does not admit a call identical to one already answered",
    )
    abstain: bool = Field(
        default=False,
        description="the prompt says to call a tool only when the request needs one "
        "(loopstack.serving.selection.requests.ABSTAIN_RULE); absent: the server's default",
    )
    decide: bool = Field(
        default=False,
        description="auto: a short hidden decision (tool name or none) before the call or the "
        "text (loopstack.serving.constraint.decision; guidance backend); absent: the server's "
        "default",
    )
    after_results: bool = Field(
        default=False,
        description="when the conversation ends with tool results, the prompt says to answer "
        "from them (loopstack.serving.selection.requests.RESULTS_RULE); absent: the server's "
        "default",
    )

    @field_validator("tool_rank", mode="before")
    @classmethod
    def _rank_off(cls, value: Any) -> Any:
        return None if value is False else value


class ChatCompletionRequest(RequestBase):
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    loopstack: LoopstackOptions = Field(default_factory=LoopstackOptions)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def effective_tool_choice(self) -> ToolChoiceMode | NamedToolChoice:
        if not self.tools:
            return "none"
        return self.tool_choice if self.tool_choice is not None else "auto"


TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class CompletionRequest(RequestBase):
    model: str
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)


class EmbeddingRequest(RequestBase):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be empty")
        return v


# --------------------------------------------------------------------------- responses
def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def chat_response(
    *,
    id_: str,
    model: str,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str,
    usage: dict[str, int],
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": id_,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": usage,
    }


def chat_chunk(
    *,
    id_: str,
    model: str,
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": []
        if delta is None and finish_reason is None
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def tool_call_dict(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
