"""The Responses API as a thin translation onto the one internal chat request.

`to_chat` turns a ``POST /v1/responses`` body (plus the history of its
``previous_response_id`` chain) into a `loopstack.serving.protocol.ChatCompletionRequest`, which
the one pipeline serves exactly as ``/v1/chat/completions``; the answer back, whole or
streamed, is `loopstack.serving.http.responses.encoder`'s.

What maps onto what:

* ``instructions`` -> the first system message (not carried along a chain, as OpenAI does);
  ``input`` as a string -> one user message; as items: ``message`` (``input_text``/
  ``output_text``/``refusal`` parts become text, ``input_image`` a note in it, as Messages
  does: the served model reads no images;
  ``developer`` -> ``system``), ``function_call`` and ``custom_tool_call`` -> the assistant's
  ``tool_calls`` (consecutive calls join one assistant message), ``function_call_output`` /
  ``custom_tool_call_output`` (``output`` a string or a list of parts) -> ``tool`` messages
  (an output whose call is neither in the input nor in the chain: 400, as OpenAI answers),
  ``reasoning`` dropped (``encrypted_content`` may be null), other item types skipped with a
  note.
* tools: ``function`` -> a chat function tool (``strict`` or not: the call is constrained
  and validated either way); ``custom`` -> a function tool of one string argument
  ``input`` (`CUSTOM_PARAMETERS`), answered as ``custom_tool_call`` with that string; its
  Lark (or regex) grammar rides along in the parameters (`lark_string.LARK_KEY`) and the
  guidance backend holds the text to it (a grammar it cannot rewrite: free text, a note); hosted
  and other types (``local_shell``, ``web_search``, ``namespace``, ...) are skipped with a
  note in the response (``loopstack.notes``), never a 400 for the whole request.
* ``tool_choice`` ``auto``/``required``/``none``, ``{"type": "function"|"custom", "name"}``
  (named), ``{"type": "allowed_tools", "mode", "tools"}`` (the tools narrowed, then the
  mode); ``text.format`` -> ``response_format``; ``max_output_tokens`` -> ``max_tokens``;
  ``prompt_cache_key`` (else ``user``) -> the session key engine calls carry.
* refused with a 400 naming the field (`refuse_unserved`): ``background``, ``conversation``
  (no Conversations API: chain with ``previous_response_id``), ``prompt`` (no stored prompt
  templates).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from loopstack.serving.constraint.lark_string import LARK_KEY, LarkUnsupported, json_string_rules
from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.responses.protocol import (
    MAX_INPUT_ITEMS,
    ResponsesRequest,
    custom_call_item,
    function_call_item,
    new_id,
)
from loopstack.serving.protocol import IMAGE_NOTE, ChatCompletionRequest

logger = logging.getLogger(__name__)

# A custom (free-form) tool as the chat path sees it: one string, its text.
CUSTOM_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
# Said after a custom tool's own description (which may say "do not wrap it in JSON")
CUSTOM_HINT = "Call it with one argument, `input`: the whole text as one JSON string."
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_TEXT_PARTS = {"input_text", "output_text", "text", "refusal", "summary_text"}
_CALLS = {"function_call", "custom_tool_call"}
_OUTPUTS = {"function_call_output", "custom_tool_call_output"}
_DROPPED = {"reasoning", "item_reference"}
_ROLES = {"user", "system", "developer", "assistant"}


@dataclass
class Translated:
    """A Responses request as the chat service takes it, and what the way back needs."""

    chat: ChatCompletionRequest
    custom: frozenset[str]  # names of the custom tools: their calls go back as custom calls
    notes: list[str] = field(default_factory=list)  # what was skipped, said in the response
    history: list[dict[str, Any]] = field(default_factory=list)  # the chain's input items


def refuse_unserved(req: ResponsesRequest) -> None:
    """400 for what a request asks and this server cannot do, named, never dropped unsaid.

    * ``background``: no queued responses.
    * ``conversation`` (an id, or ``{"id"}``; the Agents SDK's ``conversation_id``): OpenAI's
      Conversations API keeps a conversation's items server-side, behind
      ``POST /v1/conversations``, which issues the id. Not served here, so any id is one we
      never issued: refused (dropping it, as before, answered as if the earlier turns never
      happened). A chain of responses is served: ``previous_response_id``, or the whole
      history in ``input`` (what Codex sends).
    * ``prompt`` (``{id, version, variables}``): a reusable prompt template stored on
      OpenAI's platform. A self-hosted server has no template store to look it up in:
      refused; send its text as ``instructions`` and ``input``.
    """
    if req.background:
        raise InvalidRequest("background responses are not supported", param="background")
    if req.conversation is not None:
        raise InvalidRequest(
            "conversation is not supported on this server (it serves no Conversations API); "
            "chain responses with previous_response_id, or send the history in input",
            param="conversation",
            code="unsupported_parameter",
        )
    if req.prompt is not None:
        raise InvalidRequest(
            "prompt (a stored prompt template) is not supported on this server (it keeps no "
            "prompt templates); send the prompt's text as instructions and input",
            param="prompt",
            code="unsupported_parameter",
        )


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as items (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}] if req.input else []
    return list(req.input)


def to_chat(
    req: ResponsesRequest, earlier: list[dict[str, Any]] | None = None, *, grammars: bool = True
) -> Translated:
    """The chat request of `req`; `earlier`: the input and output items of its chain;
    `grammars`: whether the constraint backend enforces custom tools' grammars."""
    refuse_unserved(req)
    history = [*(earlier or []), *input_items(req)]
    if len(history) > MAX_INPUT_ITEMS:
        raise InvalidRequest(
            f"at most {MAX_INPUT_ITEMS} input items (with the previous responses'); "
            f"got {len(history)}",
            param="input",
        )
    notes: list[str] = []
    messages = _messages(history, req.instructions, notes, offset=len(earlier or []))
    if not messages:
        raise InvalidRequest("input must not be empty", param="input")
    tools, custom = _tools(req.tools or [], notes, grammars)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "stream": req.stream,
    }
    if tools:
        body["tools"] = tools
        choice = _tool_choice(req.tool_choice, tools, body)
        if choice is not None:
            body["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    elif isinstance(req.tool_choice, dict) or req.tool_choice == "required":
        raise InvalidRequest("tool_choice needs a tool that is served here", param="tool_choice")
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    for key in ("temperature", "top_p"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise InvalidRequest("text.format json_schema needs `schema`", param="text.format")
        spec = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    if req.loopstack is not None:
        body["loopstack"] = req.loopstack
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequest(f"{where}: {first.get('msg')}", param=where or None) from None
    return Translated(chat, frozenset(custom), notes, history)


# --------------------------------------------------------------------------- input items
def _messages(
    items: list[dict[str, Any]], instructions: str | None, notes: list[str], *, offset: int
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    calls = _Calls()
    for i, item in enumerate(items):
        where = f"input[{i - offset}]" if i >= offset else "previous_response_id"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object", param=where)
        kind = _kind(item.get("type"), "message" if "role" in item else "")
        calls.see(kind, item)
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise InvalidRequest(f"{where}.role must be one of {sorted(_ROLES)}", param=where)
            content = _content(item.get("content"), f"{where}.content", notes)
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind in _CALLS:
            _add_call(messages, item, where, custom=kind == "custom_tool_call")
        elif kind in _OUTPUTS:
            call_id = _string(item, "call_id", where)
            calls.check(kind, call_id)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _output(item.get("output"), f"{where}.output"),
                }
            )
        elif kind in _DROPPED:
            continue
        else:
            notes.append(f"{where}: input item type {str(kind)[:40]!r} is not served; skipped")
    return messages


class _Calls:
    """The call ids an input has made so far (its chain's first): a tool output must answer
    one of them. OpenAI refuses an output without its call (400, ``param: "input"``); we
    refused nothing and the model read an answer to a question never asked.

    Every item with a ``call_id`` counts as a call, served or not (Codex answers a skipped
    ``local_shell_call`` with a ``function_call_output``); after an ``item_reference`` (an
    item we cannot look up) nothing is refused."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.unknowable = False

    def see(self, kind: str, item: dict[str, Any]) -> None:
        if kind == "item_reference":
            self.unknowable = True
        elif kind in _CALLS:
            call_id = item.get("call_id") or item.get("id")  # as `_add_call` takes it
            if isinstance(call_id, str):
                self.ids.add(call_id)
        elif kind not in _OUTPUTS and isinstance(item.get("call_id"), str):
            self.ids.add(item["call_id"])

    def check(self, kind: str, call_id: str) -> None:
        if call_id in self.ids or self.unknowable:
            return
        what = "function" if kind == "function_call_output" else "custom tool"
        # OpenAI's words, e.g. "No tool call found for function call output with call_id
        # call_uelf...." (reported in continuedev/continue#10092)
        raise InvalidRequest(
            f"No tool call found for {what} call output with call_id {call_id[:200]}.",
            param="input",
        )


def _add_call(
    messages: list[dict[str, Any]], item: dict[str, Any], where: str, *, custom: bool
) -> None:
    name = _string(item, "name", where)
    call_id = item.get("call_id") or item.get("id") or new_id("call")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}.call_id must be a string", param=f"{where}.call_id")
    if custom:
        text = item.get("input", "")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.input must be a string", param=f"{where}.input")
        arguments = json.dumps({"input": text}, ensure_ascii=False)
    else:
        raw = item.get("arguments", "{}")
        if not isinstance(raw, str | dict):
            raise InvalidRequest(f"{where}.arguments must be a string", param=f"{where}.arguments")
        arguments = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _kind(value: Any, default: str = "") -> str:
    """An item's or part's ``type`` as a string (anything else: unknown)."""
    if value is None or value == "":
        return default
    return value if isinstance(value, str) else repr(value)[:40]


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _content(content: Any, where: str, notes: list[str]) -> str:
    """A message's content as text: a string, or its parts (text joined; an image a note on
    its own line, as the Messages API does: the served model reads no images, and Codex
    keeps a pasted image in every later turn's history)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of parts", param=where)
    text, after_note = "", False
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest(f"{here} must be an object", param=here)
        kind = _kind(part.get("type"))
        if kind in _TEXT_PARTS:
            piece = part.get("text", part.get("refusal", ""))
            if not isinstance(piece, str):
                raise InvalidRequest(f"{here}.text must be a string", param=here)
            text += "\n" + piece if after_note and piece else piece
            after_note = after_note and not piece
        elif kind == "input_image":
            text += ("\n" if text and not text.endswith("\n") else "") + IMAGE_NOTE
            after_note = True
            notes.append(f"{here}: input_image replaced by a note (this model reads no images)")
        else:
            raise InvalidRequest(f"{here}: content part type {kind!r} is not supported", param=here)
    return text


def _output(output: Any, where: str) -> str:
    """A tool's output (a string, or parts: text joined, anything else described)."""
    if isinstance(output, str):
        return output
    if output is None:
        return ""
    if isinstance(output, list):
        texts = []
        for part in output:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                texts.append(f"[{str(part.get('type'))[:40]} omitted]")
            else:
                raise InvalidRequest(f"{where} parts must be objects", param=where)
        return "\n".join(texts)
    if isinstance(output, dict):
        return json.dumps(output, ensure_ascii=False)
    raise InvalidRequest(f"{where} must be a string or a list of parts", param=where)


# --------------------------------------------------------------------------- tools
def _tools(
    tools: list[dict[str, Any]], notes: list[str], grammars: bool
) -> tuple[list[dict[str, Any]], set[str]]:
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where} must be an object", param=where)
        kind = tool.get("type")
        if kind == "function":
            fn: dict[str, Any] = {
                "name": tool.get("name"),
                "parameters": tool.get("parameters") or _EMPTY_PARAMETERS,
            }
            if tool.get("description") is not None:
                fn["description"] = tool["description"]
            if tool.get("strict") is not None:
                fn["strict"] = tool["strict"]
            out.append({"type": "function", "function": fn})
        elif kind == "custom":
            name = tool.get("name")
            said = tool.get("description") if isinstance(tool.get("description"), str) else ""
            fn = {
                "name": name,
                "parameters": _custom_parameters(tool, where, notes, grammars),
                "description": (said + "\n\n" if said else "") + CUSTOM_HINT,
            }
            out.append({"type": "function", "function": fn})
            if isinstance(name, str):
                custom.add(name)
        else:
            notes.append(f"{where}: tool type {str(kind)[:40]!r} is not served here; skipped")
    return out, custom


def _custom_parameters(
    tool: dict[str, Any], where: str, notes: list[str], grammars: bool
) -> dict[str, Any]:
    """A custom tool's parameters: one string, held to its grammar where it has one the
    backend can enforce (a Lark grammar, or a regex as one), else free (said in a note)."""
    fmt = tool.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise InvalidRequest(f"{where}.format must be text or grammar", param=where)
    if fmt.get("type") == "text":
        return CUSTOM_PARAMETERS
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    lark = None
    if isinstance(definition, str) and syntax == "lark":
        lark = definition
    elif isinstance(definition, str) and syntax == "regex":
        lark = "start: /" + definition.replace("/", "\\/") + "/"
    why = None if lark is not None else f"its {str(syntax)[:16]!r} grammar cannot be read"
    if lark is not None and not grammars:
        why = "only the guidance constraint backend enforces grammars"
    elif lark is not None:
        try:
            json_string_rules(lark, "x_")
        except LarkUnsupported as exc:
            why = str(exc)[:200]
    if why is None:
        return {**CUSTOM_PARAMETERS, LARK_KEY: lark}
    notes.append(
        f"{where} ({str(tool.get('name'))[:64]}): grammar not enforced ({why}); "
        "the input is free text"
    )
    return CUSTOM_PARAMETERS


def _tool_choice(
    choice: str | dict[str, Any] | None, tools: list[dict[str, Any]], body: dict[str, Any]
) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    names = [t["function"]["name"] for t in tools]
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names {str(name)[:64]!r}, which is not among the served tools",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        listed = choice.get("tools")
        allowed = (
            {str(t.get("name")) for t in listed if isinstance(t, dict)}
            if isinstance(listed, list)
            else set()
        )
        kept = [t for t in tools if t["function"]["name"] in allowed]
        if not kept:
            raise InvalidRequest("tool_choice.tools names no served tool", param="tool_choice")
        body["tools"] = kept
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise InvalidRequest("tool_choice.mode must be auto or required", param="tool_choice")
        return str(mode)
    raise InvalidRequest(
        f"tool_choice of type {str(kind)[:40]!r} is not served here", param="tool_choice"
    )


# --------------------------------------------------------------------------- the way back
def call_item(
    call_id: str,
    name: str,
    arguments: str,
    custom: frozenset[str],
    *,
    status: str = "completed",
    id_: str | None = None,
) -> dict[str, Any]:
    """A chat tool call as a Response output item (a custom tool's as ``custom_tool_call``)."""
    if name in custom:
        return custom_call_item(
            id_=id_ or new_id("ctc"),
            call_id=call_id,
            name=name,
            input_=custom_input(arguments),
            status=status,
        )
    return function_call_item(
        id_=id_ or new_id("fc"), call_id=call_id, name=name, arguments=arguments, status=status
    )


def custom_input(arguments: str) -> str:
    """A custom call's text, from its chat arguments ``{"input": "..."}``."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


def status_of(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None
