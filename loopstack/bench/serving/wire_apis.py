"""The validity bench's requests through the other two wire APIs: OpenAI Responses
(``/v1/responses``) and Anthropic Messages (``/v1/messages``).

One corpus request is built once, as chat.completions keyword arguments
(``tool_validity.request_kwargs``); here it is translated into the other API's body, sent
with httpx (plain JSON, not streamed), and the answer's calls are read back into the chat
message shape (``{"content", "tool_calls": [{"function": {"name", "arguments"}}]}``) so the
same check and summary apply to all three APIs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, cast

import httpx

from loopstack.bench.common import JSON

Api = Literal["chat", "responses", "messages"]
APIS: tuple[Api, ...] = ("chat", "responses", "messages")
PATHS: dict[Api, str] = {
    "chat": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
}
ANTHROPIC_VERSION = "2023-06-01"


class WireError(Exception):
    """An HTTP error answer (status >= 400) from the Responses or Messages endpoint."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


@dataclass
class WireAnswer:
    """One answer read back into the chat shape."""

    message: JSON
    finish_reason: str | None
    completion_tokens: int | None


def parse_apis(text: str) -> list[Api]:
    """``chat,responses`` -> ["chat", "responses"]; an unknown name is a SystemExit."""
    apis: list[Api] = []
    for name in (p.strip() for p in text.split(",")):
        if not name:
            continue
        if name not in APIS:
            raise SystemExit(f"unknown api {name!r} (one of {', '.join(APIS)})")
        if name not in apis:
            apis.append(cast(Api, name))
    return apis


def arm_supported(api: Api, arm: str) -> bool:
    """The Messages API has no field for our ``loopstack`` switch: no unconstrained arm."""
    return not (api == "messages" and arm == "unconstrained")


# --------------------------------------------------------------------------- requests
def _function(tool: JSON) -> JSON:
    fn = tool["function"] if tool.get("type") == "function" and "function" in tool else tool
    return cast(JSON, fn)


def responses_tool(tool: JSON) -> JSON:
    fn = _function(tool)
    out: JSON = {"type": "function", "name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    if fn.get("strict") is not None:
        out["strict"] = fn["strict"]
    return out


def messages_tool(tool: JSON) -> JSON:
    fn = _function(tool)
    out: JSON = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["input_schema"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def _named(choice: Any) -> str | None:
    if isinstance(choice, dict):
        return str(choice["function"]["name"])
    return None


def responses_body(kwargs: JSON) -> JSON:
    """The /v1/responses body for chat.completions keyword arguments."""
    choice = kwargs.get("tool_choice")
    name = _named(choice)
    body: JSON = {
        "model": kwargs["model"],
        "input": [
            {"type": "message", "role": m["role"], "content": m["content"]}
            for m in kwargs["messages"]
        ],
        "tools": [responses_tool(t) for t in kwargs.get("tools", [])],
        "tool_choice": {"type": "function", "name": name} if name else choice,
        "max_output_tokens": kwargs["max_tokens"],
        "temperature": kwargs.get("temperature"),
        "store": False,
    }
    body.update(kwargs.get("extra_body") or {})  # the `loopstack` switch: carried as is
    return {k: v for k, v in body.items() if v is not None}


def messages_body(kwargs: JSON) -> JSON:
    """The /v1/messages body for chat.completions keyword arguments (no seed, no switch:
    Anthropic's API has neither; see `arm_supported`)."""
    choice = kwargs.get("tool_choice")
    name = _named(choice)
    if name:
        tool_choice: JSON = {"type": "tool", "name": name}
    else:
        tool_choice = {"type": {"required": "any", "auto": "auto", "none": "none"}[str(choice)]}
    system = [m["content"] for m in kwargs["messages"] if m["role"] == "system"]
    body: JSON = {
        "model": kwargs["model"],
        "messages": [m for m in kwargs["messages"] if m["role"] != "system"],
        "tools": [messages_tool(t) for t in kwargs.get("tools", [])],
        "tool_choice": tool_choice,
        "max_tokens": kwargs["max_tokens"],
        "temperature": kwargs.get("temperature"),
        "system": "\n\n".join(system) or None,
    }
    return {k: v for k, v in body.items() if v is not None}


# --------------------------------------------------------------------------- answers
def from_responses(data: JSON) -> WireAnswer:
    """function_call output items -> tool_calls; message output text -> content."""
    calls: list[JSON] = []
    texts: list[str] = []
    for item in data.get("output") or []:
        if item.get("type") == "function_call":
            fn = {"name": item.get("name"), "arguments": item.get("arguments")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": fn})
        elif item.get("type") == "message":
            texts += [
                c.get("text") or ""
                for c in item.get("content") or []
                if c.get("type") == "output_text"
            ]
    incomplete = (data.get("incomplete_details") or {}).get("reason")
    finish = "length" if incomplete == "max_output_tokens" else ("tool_calls" if calls else "stop")
    usage = data.get("usage") or {}
    message: JSON = {"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls}
    return WireAnswer(message, finish, usage.get("output_tokens"))


def from_messages(data: JSON) -> WireAnswer:
    """tool_use content blocks -> tool_calls (``input`` kept as the object); text -> content."""
    calls: list[JSON] = []
    texts: list[str] = []
    for block in data.get("content") or []:
        if block.get("type") == "tool_use":
            fn = {"name": block.get("name"), "arguments": block.get("input")}
            calls.append({"id": block.get("id"), "type": "function", "function": fn})
        elif block.get("type") == "text":
            texts.append(block.get("text") or "")
    stop = data.get("stop_reason")
    finish = {"max_tokens": "length", "tool_use": "tool_calls"}.get(stop or "", "stop")
    usage = data.get("usage") or {}
    message: JSON = {"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls}
    return WireAnswer(message, finish, usage.get("output_tokens"))


# --------------------------------------------------------------------------- transport
def make_http(base_url: str, api_key: str, timeout: float) -> httpx.AsyncClient:
    """The client for /responses and /messages (tests replace it with a MockTransport one)."""
    headers = {
        "authorization": f"Bearer {api_key}",
        "x-api-key": api_key,
        "anthropic-version": ANTHROPIC_VERSION,
    }
    return httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)


async def send(http: httpx.AsyncClient, api: Api, kwargs: JSON) -> WireAnswer:
    """POST one request through ``api`` (responses or messages) and read the calls back.
    Raises WireError on an HTTP error answer, httpx.TransportError when unreachable."""
    if api == "responses":
        body, read = responses_body(kwargs), from_responses
    elif api == "messages":
        body, read = messages_body(kwargs), from_messages
    else:
        raise ValueError(f"send is for responses and messages, not {api!r}")
    resp = await http.post(PATHS[api], json=body)
    if resp.status_code >= 400:
        raise WireError(resp.status_code, _error_message(resp))
    return read(resp.json())


def _error_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return json.dumps(data)
