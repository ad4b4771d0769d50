"""Tools from MCP servers, over stdio or streamable HTTP, through the official `mcp` SDK (2.x).

    async with MCPToolServer(MCPServerSpec.parse("mcp-server-time --local-timezone UTC")) as s:
        registry.add(*s.tools)            # names like "time__get_current_time"

The SDK's transports and `ClientSession` are anyio context managers whose cancel scopes must
be entered and left by the same task. So one dedicated task (`_serve`) owns them for the
server's whole life: it connects, lists the tools, then waits for `__aexit__`; tool calls from
any task go through the session it opened and race three things: the answer, the per-call
timeout, and the death of the connection (the server exited, or wrote something that is not
JSON-RPC). A server that crashes, hangs or answers garbage therefore gives `ToolServerError` or
`ToolTimeout` within `timeout_s`, never a hang; on exit the SDK stops the subprocess tree and a
last check kills any process of the server's group still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

import anyio
import psutil
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from loopstack.agent.exceptions import ConfigError, ToolServerError, ToolTimeout
from loopstack.agent.protocols import Tool

logger = logging.getLogger(__name__)

SEPARATOR = "__"
_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PREFIX_FORM = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,31})=(\S.*)$")
_LAUNCHERS = {"uvx", "npx", "pipx", "python", "python3", "node", "bunx", "deno", "uv", "run"}
_SHUTDOWN_S = 10.0  # the SDK's own bounded shutdown is ~2 s of grace plus a kill
_STDERR_TAIL = 600


def _clean(text: str) -> str:
    """Characters OpenAI allows in a function name; no double underscore (our separator)."""
    text = re.sub(r"[^a-zA-Z0-9_-]+", "_", text)
    text = re.sub(r"_{2,}", "_", text).strip("_-")
    return text or "mcp"


def _name_from_command(argv: list[str]) -> str:
    for token in argv:
        base = os.path.basename(token)
        if token.startswith("-") or base in _LAUNCHERS or re.match(r"python3?(\.\d+)?$", base):
            continue
        base = base.rsplit("/", 1)[-1]  # "@scope/server-x" -> "server-x"
        base = re.sub(r"\.(py|js|mjs|ts)$", "", base)
        for prefix in ("mcp-server-", "mcp_server_", "server-", "mcp-"):
            if base.startswith(prefix) and len(base) > len(prefix):
                base = base[len(prefix) :]
                break
        for suffix in ("-mcp-server", "-mcp", "_mcp", "-server"):
            if base.endswith(suffix) and len(base) > len(suffix):
                base = base[: -len(suffix)]
                break
        return _clean(base)
    return "mcp"


def _name_from_url(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "mcp").replace(".", "-")
    return _clean(f"{host}-{parts.port}" if parts.port else host)


def tool_name(server: str, tool: str) -> str:
    """`server__tool`, cut to 64 characters with a short hash when too long."""
    name = f"{server}{SEPARATOR}{_clean(tool)}"
    if len(name) <= 64:
        return name
    digest = hashlib.sha1(tool.encode()).hexdigest()[:6]
    return f"{name[: 64 - 7]}-{digest}"


@dataclass(frozen=True)
class MCPServerSpec:
    """How to reach one MCP server; ``name`` namespaces its tools as ``f"{name}__{tool}"``."""

    name: str
    command: list[str] | None = None  # stdio transport
    url: str | None = None  # streamable HTTP transport
    env: dict[str, str] | None = None  # stdio: added over the SDK's safe default variables
    headers: dict[str, str] | None = None  # streamable HTTP: sent with every request
    timeout_s: float = 30.0  # per call, and for startup + list_tools
    startup_timeout_s: float | None = None  # connect + initialize + list_tools; None: timeout_s

    @property
    def startup_s(self) -> float:
        return self.startup_timeout_s if self.startup_timeout_s is not None else self.timeout_s

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError("an MCP server needs exactly one of a command or a URL")
        if self.command is not None and not self.command:
            raise ConfigError("empty MCP server command")
        if not _NAME_OK.match(self.name) or SEPARATOR in self.name or len(self.name) > 32:
            raise ConfigError(f"MCP server name {self.name!r}: use 1-32 of [a-zA-Z0-9_-], no '__'")
        if self.timeout_s <= 0 or self.startup_s <= 0:
            raise ConfigError("MCP timeout_s must be positive")
        if self.headers and self.url is None:
            raise ConfigError(f"MCP server {self.name}: headers need a URL (streamable HTTP)")

    @classmethod
    def parse(cls, text: str, *, timeout_s: float = 30.0) -> MCPServerSpec:
        """``"mcp-server-time --local-timezone UTC"`` (stdio, name ``time``),
        ``"http://127.0.0.1:3001/mcp"`` (HTTP, name ``127-0-0-1-3001``), or either with a
        ``"name=..."`` prefix to choose the namespace."""
        text = text.strip()
        if not text:
            raise ConfigError("empty --mcp value")
        name: str | None = None
        match = _PREFIX_FORM.match(text)
        if match and not match.group(2).startswith("="):
            name, text = match.group(1), match.group(2).strip()
        if re.match(r"^https?://", text):
            if len(text.split()) != 1:
                raise ConfigError(f"an MCP URL takes no arguments: {text!r}")
            return cls(name=name or _name_from_url(text), url=text, timeout_s=timeout_s)
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"cannot parse MCP command {text!r}: {exc}") from exc
        return cls(name=name or _name_from_command(argv), command=argv, timeout_s=timeout_s)


@dataclass
class MCPTool:
    """One tool of a connected server; satisfies `loopstack.agent.protocols.Tool`."""

    name: str
    description: str
    parameters: dict[str, Any]
    dangerous: bool
    remote_name: str
    server: MCPToolServer = field(repr=False)

    async def call(self, arguments: dict[str, Any]) -> Any:
        return await self.server.call_tool(self.remote_name, arguments)


def _is_dangerous(tool: mcp_types.Tool) -> bool:
    hints = tool.annotations
    if hints is None:
        return False  # most servers annotate nothing; the allowlist still applies
    return bool(hints.destructive_hint) and not hints.read_only_hint


def _content_value(block: Any) -> Any:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return {"type": kind, "mime_type": getattr(block, "mime_type", None)}
    if kind == "resource":
        inner = block.resource
        return {"type": "resource", "uri": str(inner.uri), "text": getattr(inner, "text", None)}
    if hasattr(block, "model_dump"):
        return block.model_dump(mode="json", exclude_none=True)
    return str(block)


def result_value(result: mcp_types.CallToolResult) -> Any:
    """The structured content when the server gave one, else the text (or a list of parts)."""
    if result.structured_content is not None:
        return result.structured_content
    values = [_content_value(b) for b in result.content]
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, str) for v in values):
        return "\n".join(values)
    return values


class MCPToolServer:
    """An async context manager that connects to one MCP server and exposes its tools."""

    def __init__(self, spec: MCPServerSpec) -> None:
        self.spec = spec
        self._tools: list[Tool] = []
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._dead = asyncio.Event()  # the connection is gone or spoke garbage
        self._death: str | None = None
        self._pids: set[int] = set()
        self._stderr: IO[str] | None = None

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools)

    @property
    def pids(self) -> set[int]:
        """Process ids of the stdio server (its process group leaders); empty for HTTP."""
        return set(self._pids)

    async def __aenter__(self) -> MCPToolServer:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[list[mcp_types.Tool]] = loop.create_future()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp:{self.spec.name}")
        try:
            listed = await ready
        except BaseException:
            await self._shutdown()
            raise
        self._tools = self._wrap(listed)
        if self._tools:
            logger.info("mcp server %s: %d tools", self.spec.name, len(self._tools))
        else:  # most often a missing key or config variable: say so, with what it said
            tail = self._stderr_tail()
            logger.warning(
                "mcp server %s lists no tools (missing environment or auth? see --mcp-env, "
                "--mcp-header)%s",
                self.spec.name,
                f"; its stderr: {tail}"
                if tail
                else ("" if self.spec.url else "; it wrote nothing to stderr"),
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shutdown()

    # --- the task that owns the SDK's context managers ---------------------------------

    async def _serve(self, ready: asyncio.Future[list[mcp_types.Tool]]) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        read_timeout_seconds=self.spec.startup_s,  # calls pass their own
                        message_handler=self._on_message,
                    )
                )
                listed = await self._handshake(session)
                self._session = session
                ready.set_result(listed)
                closing = asyncio.ensure_future(self._closing.wait())
                dead = asyncio.ensure_future(self._dead.wait())
                try:
                    await asyncio.wait({closing, dead}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closing.cancel()
                    dead.cancel()
                # After a protocol failure keep the session open (calls fail fast on `_dead`)
                # until the owner closes us; then leave every context in this same task.
                await self._closing.wait()
        except Exception as exc:
            if isinstance(_innermost(exc), TimeoutError) and not self._dead.is_set():
                self._fail(f"no answer to initialize/list_tools within {self.spec.startup_s:g} s")
                if not ready.done():
                    ready.set_exception(ToolTimeout(self._describe()))
            self._fail(_explain(exc))
            if not ready.done():
                ready.set_exception(ToolServerError(self._describe()))
        except BaseException as exc:  # cancelled: the owner gave up on us
            self._fail(f"connection task ended ({type(exc).__name__})")
            if not ready.done():
                ready.set_exception(ToolServerError(self._describe()))
            raise
        else:
            self._fail("connection closed")
        finally:
            self._session = None

    async def _handshake(self, session: ClientSession) -> list[mcp_types.Tool]:
        """initialize + tools/list, bounded by the timeout and cut short by garbage or EOF.
        The cancel scopes open and close here, inside the contexts `_serve` entered."""
        listed: list[mcp_types.Tool] | None = None

        async def watch(scope: anyio.CancelScope) -> None:
            await self._dead.wait()
            scope.cancel()

        with anyio.fail_after(self.spec.startup_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                await session.initialize()
                listed = await self._list_tools(session)
                tg.cancel_scope.cancel()
        if listed is None:
            raise ToolServerError(self._describe())
        return listed

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        spec = self.spec
        if spec.url is not None:
            if spec.headers:
                return _http_with_headers(spec.url, spec.headers)
            return streamable_http_client(spec.url)
        assert spec.command is not None
        command = _resolve(spec.command[0])
        params = StdioServerParameters(command=command, args=spec.command[1:], env=spec.env)
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        return _tracking(stdio_client(params, errlog=self._stderr), self._pids)

    async def _list_tools(self, session: ClientSession) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a server that pages forever is a broken server
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise ToolServerError(f"MCP server {self.spec.name}: tools/list never ends")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):  # a line that is not JSON-RPC, or a broken pipe
            self._fail(f"invalid message from server: {message}")

    def _fail(self, reason: str) -> None:
        if self._death is None:
            self._death = reason
        self._dead.set()

    def _describe(self) -> str:
        text = f"MCP server {self.spec.name}: {self._death or 'not connected'}"
        tail = self._stderr_tail()
        return f"{text} (stderr: {tail})" if tail else text

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.flush()
            self._stderr.seek(0)
            return " ".join(self._stderr.read()[-_STDERR_TAIL:].split())
        return ""

    # --- calls, from any task ------------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        session = self._session
        if session is None or self._dead.is_set():
            raise ToolServerError(self._describe())
        timeout = self.spec.timeout_s
        call = asyncio.ensure_future(
            session.call_tool(name, arguments, read_timeout_seconds=timeout + 1.0)
        )
        dead = asyncio.ensure_future(self._dead.wait())
        try:
            done, _ = await asyncio.wait(
                {call, dead}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            dead.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
        if call in done:
            try:
                result = call.result()
            except Exception as exc:
                if self._dead.is_set():
                    raise ToolServerError(self._describe()) from exc
                raise ToolServerError(f"MCP {self.spec.name}/{name}: {_explain(exc)}") from exc
            if not isinstance(result, mcp_types.CallToolResult):
                raise ToolServerError(f"MCP {self.spec.name}/{name}: unexpected {result!r:.200}")
            if result.is_error:
                raise ToolServerError(f"MCP {self.spec.name}/{name}: {result_value(result)}")
            return result_value(result)
        if self._dead.is_set():
            raise ToolServerError(self._describe())
        raise ToolTimeout(f"MCP {self.spec.name}/{name}: no answer within {timeout:g} s")

    def _wrap(self, listed: list[mcp_types.Tool]) -> list[Tool]:
        tools: list[Tool] = []
        seen: set[str] = set()
        for tool in listed:
            name = tool_name(self.spec.name, tool.name)
            if name in seen:
                logger.warning("mcp %s: duplicate tool name %s skipped", self.spec.name, name)
                continue
            seen.add(name)
            schema = dict(tool.input_schema or {})
            schema.setdefault("type", "object")
            if schema.get("type") == "object":
                schema.setdefault("properties", {})
            tools.append(
                MCPTool(
                    name=name,
                    description=(tool.description or tool.title or tool.name).strip()[:1024],
                    parameters=schema,
                    dangerous=_is_dangerous(tool),
                    remote_name=tool.name,
                    server=self,
                )
            )
        return tools

    # --- teardown --------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), _SHUTDOWN_S)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 2.0)
            except Exception:  # already reported through _death
                pass
        elif task is not None:
            with contextlib.suppress(BaseException):
                task.result()
        _kill_groups(self._pids)
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()


@contextlib.asynccontextmanager
async def _http_with_headers(url: str, headers: dict[str, str]) -> Any:
    """The SDK's streamable-HTTP transport over a client that sends ``headers`` (auth)."""
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


@contextlib.asynccontextmanager
async def _tracking(inner: contextlib.AbstractAsyncContextManager[Any], pids: set[int]) -> Any:
    """Enter the SDK's stdio transport and remember which child it spawned."""
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    async with inner as streams:
        pids.update(p.pid for p in me.children() if p.pid not in before)
        yield streams


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _explain(exc: BaseException) -> str:
    """The innermost error of an (anyio) exception group, as one line."""
    exc = _innermost(exc)
    return f"{type(exc).__name__}: {exc}"


def _kill_groups(pids: set[int]) -> None:
    """Last line of defence: the SDK stops the server tree; kill what it may have missed."""
    for pid in pids:
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            logger.warning("mcp server process %d outlived its shutdown: killing its group", pid)
            os.killpg(pid, signal.SIGKILL)


def _resolve(command: str) -> str:
    """A bare command found on PATH, else next to this interpreter (an unactivated venv)."""
    if os.sep in command or shutil.which(command):
        return command
    beside = os.path.join(os.path.dirname(sys.executable), command)
    return beside if os.access(beside, os.X_OK) else command
