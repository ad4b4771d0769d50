"""The Anthropic Messages wire format, and its translation onto the one chat request.

`MessagesRequest` is the body of ``POST /v1/messages`` (and ``/count_tokens``), validated where
we act on a field and passed through otherwise (``extra="allow"``: ``thinking``,
``context_management`` and the other fields Claude Code sends are accepted and ignored).
`to_chat` turns it into a `loopstack.serving.protocol.ChatCompletionRequest`, so that admission,
limits, the constraint backend and its guarantee, metrics and trace ids are the chat path's own
code. The answer back is `loopstack.serving.http.messages.encoder`'s.

What does not map is said, not refused: an image becomes a note in the text (the served model
reads no images), a text ``document`` its title and text (a PDF one a note), a server tool
(``web_search_20250305``, ``bash_20250124``, ...: no ``input_schema``) is skipped,
``thinking`` blocks are dropped. A ``tool_result`` that answers no ``tool_use`` of the
previous assistant message is refused, in Anthropic's words (`_check_results`).

Claude Code's system prompt starts with an attribution line (``x-anthropic-billing-header:
cc_version=...; cc_entrypoint=...; cch=...``) that changes per conversation; it is removed
before the prompt is built (`strip_attribution`), so the engine's prefix cache keeps the
~19k-token prompt across conversations (vLLM, llama.cpp and Ollama strip it too).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loopstack.serving.protocol import IMAGE_NOTE, ChatCompletionRequest, check_json_values

__all__ = [
    "ATTRIBUTION",
    "IMAGE_NOTE",
    "MessagesRequest",
    "stop_reason",
    "strip_attribution",
    "to_chat",
]

_MAX_TOKENS = 2**31 - 1
#: Claude Code's attribution line, wherever it sits in the system prompt.
ATTRIBUTION = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(\n|$)", re.MULTILINE | re.I)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class Block(_Open):
    """Any content block: ``text``, ``image``, ``document``, ``tool_use``, ``tool_result``,
    ``thinking``, ``redacted_thinking``... read by `type` in the translation."""

    type: str


class InputMessage(_Open):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolSpec(_Open):
    """A client tool (``input_schema``) or a server tool (a ``type`` such as
    ``web_search_20250305`` and no schema: skipped, the model cannot run it here)."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(_Open):
    user_id: str | None = None


class MessagesRequest(_Open):
    model: str = Field(min_length=1)
    messages: list[InputMessage]
    max_tokens: int = Field(ge=1, le=_MAX_TOKENS)
    system: str | list[TextBlock] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    metadata: Metadata | None = None
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any) -> Any:
        check_json_values(data)  # NaN, lone surrogates, deep nesting: a 400, not a 500
        return data


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(default=1, ge=1, le=_MAX_TOKENS)  # not sent to count_tokens


# --------------------------------------------------------------------------- request
def strip_attribution(text: str) -> str:
    return ATTRIBUTION.sub("", text)


def _text_of(content: str | list[Block] | list[Any], notes: list[str]) -> str:
    """The text of a content (a string or blocks): text kept, images noted, thinking
    dropped, anything else shown as JSON."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        data = block.model_dump() if isinstance(block, BaseModel) else dict(block)
        kind = data.get("type")
        if kind == "text":
            parts.append(str(data.get("text", "")))
        elif kind == "image":
            parts.append(IMAGE_NOTE)
            notes.append("image content replaced by a note")
        elif kind == "document":
            parts.append(_document(data, notes))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            parts.append(json.dumps(data, ensure_ascii=False))
    return "\n".join(p for p in parts if p)


def _document(data: dict[str, Any], notes: list[str]) -> str:
    """A ``document`` block as the text the model reads: its title and context, then its
    text (``source.type`` ``text``, or ``content``: a string or text blocks); a PDF, a URL or
    a file id (nothing we can read as text) becomes a note."""
    raw = data.get("source")
    source: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind = source.get("type")
    text: str | None = None
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content" and isinstance(source.get("content"), str):
        text = source["content"]
    elif kind == "content" and isinstance(source.get("content"), list):
        blocks = [b for b in source["content"] if isinstance(b, dict)]
        text = _text_of([Block(**b) for b in blocks if isinstance(b.get("type"), str)], notes)
    title = data.get("title") if isinstance(data.get("title"), str) else None
    if text is None:
        what = str(source.get("media_type") or kind or "unknown")[:60]
        notes.append(f"document content ({what}) replaced by a note")
        named = f" ({title})" if title else ""
        return f"[a document{named} was attached here; this model cannot read {what} documents]"
    head = [f"[document: {title}]" if title else "[document]"]
    if isinstance(data.get("context"), str) and data["context"]:
        head.append(data["context"])
    return "\n".join([*head, text, "[end of document]"])


def _system(req: MessagesRequest, notes: list[str]) -> str:
    if isinstance(req.system, str):
        parts = [req.system]
    else:
        parts = [b.text for b in req.system or []]
    # Claude Code >= 2.1.154 also sends role "system" entries inside `messages`: folded in.
    parts += [_text_of(m.content, notes) for m in req.messages if m.role == "system"]
    text = "\n\n".join(strip_attribution(p).strip("\n") for p in parts)
    return text.strip("\n")


def _user(msg: InputMessage, notes: list[str]) -> list[dict[str, Any]]:
    """A user turn: its tool results first (each a ``tool`` message), then its text."""
    if isinstance(msg.content, str):
        return [{"role": "user", "content": msg.content}]
    out: list[dict[str, Any]] = []
    rest: list[Block] = []
    for block in msg.content:
        if block.type != "tool_result":
            rest.append(block)
            continue
        data = block.model_dump()
        raw = data.get("content")
        text = _text_of([Block(**b) for b in raw], notes) if isinstance(raw, list) else raw
        text = "" if text is None else str(text)
        if data.get("is_error"):
            text = f"[tool error] {text}"
        call_id = str(data.get("tool_use_id") or "")
        if not call_id:
            raise ValueError("a tool_result block needs its tool_use_id")
        out.append({"role": "tool", "tool_call_id": call_id, "content": text})
    if rest:
        text = _text_of(rest, notes)
        if text or not out:
            out.append({"role": "user", "content": text})
    return out


def _tool_use_ids(msg: InputMessage) -> set[str]:
    if isinstance(msg.content, str):
        return set()
    found = (b.model_dump().get("id") for b in msg.content if b.type == "tool_use")
    return {str(i) for i in found if i}


def _check_results(msg: InputMessage, index: int, uses: set[str]) -> None:
    """Each ``tool_result`` must answer a ``tool_use`` of the previous assistant message
    (``system`` entries in between are no turn; consecutive user or assistant messages are one
    turn, as Anthropic merges them): Anthropic refuses it otherwise, in these words."""
    if isinstance(msg.content, str):
        return
    orphans = [
        (j, str(b.model_dump().get("tool_use_id") or ""))
        for j, b in enumerate(msg.content)
        if b.type == "tool_result"
    ]
    orphans = [(j, id_) for j, id_ in orphans if id_ and id_ not in uses]
    if orphans:
        ids = ", ".join(id_[:200] for _, id_ in orphans[:10])
        raise ValueError(
            f"messages.{index}.content.{orphans[0][0]}: unexpected `tool_use_id` found in "
            f"`tool_result` blocks: {ids}. Each `tool_result` block must have a corresponding "
            "`tool_use` block in the previous message."
        )


def _assistant(msg: InputMessage, notes: list[str]) -> dict[str, Any]:
    if isinstance(msg.content, str):
        return {"role": "assistant", "content": msg.content}
    calls, text = [], []
    for block in msg.content:
        data = block.model_dump()
        if block.type == "tool_use":
            args = data.get("input")
            calls.append(
                {
                    "id": str(data.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"),
                    "type": "function",
                    "function": {
                        "name": str(data.get("name", "")),
                        "arguments": json.dumps(args if args is not None else {}),
                    },
                }
            )
        else:
            text.append(block)
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(text, notes)}
    if calls:
        out["tool_calls"] = calls
    return out


def to_chat(
    req: MessagesRequest, *, stream: bool | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The chat request body (validate it with `ChatCompletionRequest`) and the notes on
    what was dropped or replaced. Raises ValueError for a history that cannot be carried."""
    notes: list[str] = []
    messages: list[dict[str, Any]] = []
    system = _system(req, notes)
    if system:
        messages.append({"role": "system", "content": system})
    uses: set[str] = set()  # the tool_use ids of the latest assistant turn
    last = ""  # the latest turn's role (system entries are none)
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            _check_results(msg, i, uses)
            messages += _user(msg, notes)
        elif msg.role == "assistant":
            messages.append(_assistant(msg, notes))
            # consecutive assistant messages are one turn, as Anthropic merges them
            uses = (uses if last == "assistant" else set()) | _tool_use_ids(msg)
        if msg.role != "system":
            last = msg.role
    if len(messages) == (1 if system else 0):
        raise ValueError("messages: at least one user or assistant message is needed")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "stream": req.stream if stream is None else stream,
    }
    tools: list[dict[str, Any]] = []
    for tool in req.tools or []:
        if any(t["function"]["name"] == tool.name for t in tools):
            raise ValueError(f"tools: duplicate tool name {tool.name!r}")
        if tool.input_schema is None:
            notes.append(f"server tool {tool.name!r} ({tool.type}) skipped")
            continue
        fn: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description:
            fn["description"] = tool.description
        tools.append({"type": "function", "function": fn})
    choice = req.tool_choice
    if tools:
        body["tools"] = tools
        if choice is not None:
            if choice.type == "tool":
                if not choice.name:
                    raise ValueError("tool_choice of type 'tool' needs a name")
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            else:
                body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[
                    choice.type
                ]
            if choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
    elif choice is not None and choice.type in ("any", "tool"):
        raise ValueError(f"tool_choice {choice.type!r} needs at least one client tool")
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    for key in ("temperature", "top_p", "top_k"):
        if (value := getattr(req, key)) is not None:
            body[key] = value
    if req.metadata is not None and req.metadata.user_id:
        body["user"] = req.metadata.user_id
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body, notes


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(body)


# --------------------------------------------------------------------------- response
def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(
    finish_reason: str | None, matched: Any, stop_sequences: list[str] | None
) -> tuple[str, str | None]:
    """Anthropic's stop reason (and matched stop sequence) for a chat finish reason."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def usage(prompt_tokens: int, output_tokens: int, cached: int | None) -> dict[str, int]:
    """``input_tokens`` excludes the cache reads, as Anthropic counts them."""
    read = cached or 0
    return {
        "input_tokens": max(0, prompt_tokens - read),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }


def tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:  # a call cut by max_tokens: its text, as far as it went
        return {"_truncated_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}
