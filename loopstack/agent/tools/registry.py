"""Tools: typed Python functions and `Tool` objects in one registry, grouped per task.

* `FunctionTool` wraps a typed function: the JSON Schema comes from the signature (pydantic
  builds each parameter's schema: ``Literal`` becomes ``enum``, ``X | None = None`` an
  optional ``X``, defaults are kept) and the docstring (first paragraph = description,
  ``Args:`` lines = parameter descriptions).
* `ToolRegistry` holds tools by name and group; ``execute`` validates the arguments with
  jsonschema, runs the call under a timeout (cancelled when it expires) and returns a
  `ToolResult`; large results are trimmed with a summary header first.
* `load_tools_file` turns every public top-level function of a ``.py`` file that has type
  hints and a docstring into a tool. Mark dangerous ones (approval before each call) with a
  module-level ``DANGEROUS = {"name", ...}`` set or the `tool` decorator.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import inspect
import json
import re
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

import jsonschema
from pydantic import TypeAdapter

from loopstack.agent.exceptions import (
    AgentError,
    ConfigError,
    ToolArgumentsError,
    ToolError,
    ToolNotAllowed,
    ToolTimeout,
    error_body,
)
from loopstack.agent.protocols import Tool, ToolResult

if TYPE_CHECKING:
    from loopstack.agent.tools.retry import RetryPolicy

__all__ = [
    "FunctionTool",
    "ToolRegistry",
    "load_tools_file",
    "loads_arguments",
    "result_summary",
    "schema_from_function",
    "tool",
]

_DANGEROUS_ATTR = "__loopstack_dangerous__"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def tool(fn: Callable[..., Any] | None = None, *, dangerous: bool = False) -> Any:
    """Decorator for tools files: ``@tool(dangerous=True)`` marks a function as dangerous."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _DANGEROUS_ATTR, dangerous)
        return f

    return mark(fn) if fn is not None else mark


# --- schema from a signature ---------------------------------------------------------------


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head: list[str] = []
    args: dict[str, str] = {}
    current: str | None = None
    section, indent = "head", -1
    for line in doc.splitlines():
        stripped = line.strip()
        if re.match(r"^(Args|Arguments|Parameters|Params):\s*$", stripped):
            section = "args"
            continue
        if re.match(r"^(Returns?|Raises|Yields|Examples?|Notes?):\s*$", stripped):
            section = "other"
            continue
        if section == "head":
            if not stripped and head:
                section = "rest"
            elif stripped:
                head.append(stripped)
        elif section == "args" and stripped:
            m = re.match(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            level = len(line) - len(line.lstrip())
            if m and (indent < 0 or level <= indent):
                indent = level
                current = m.group(1).lstrip("*")
                args[current] = m.group(2).strip()
            elif current:
                args[current] = (args[current] + " " + stripped).strip()
    return " ".join(head), args


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def _param_schema(annotation: Any, default: Any) -> dict[str, Any]:
    schema: dict[str, Any] = _strip_titles(TypeAdapter(annotation).json_schema())
    any_of = schema.get("anyOf")
    if default is None and isinstance(any_of, list):  # `X | None = None`: optional X
        rest = [s for s in any_of if s != {"type": "null"}]
        if len(rest) == 1:
            schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, **rest[0]}
    if default is not inspect.Parameter.empty and default is not None:
        try:
            json.dumps(default)
            schema["default"] = default
        except TypeError:
            pass
    return schema


def schema_from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, JSON Schema of the arguments object) of a typed function."""
    description, arg_docs = _parse_docstring(fn.__doc__ or "")
    hints = get_type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in hints:
            raise ConfigError(f"{fn.__name__}: parameter {name!r} has no type hint")
        schema = _param_schema(hints[name], param.default)
        if arg_docs.get(name):
            schema["description"] = arg_docs[name]
        props[name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(name)
    params: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    params["additionalProperties"] = False
    return description, params


class FunctionTool:
    """A typed Python function (sync or async) as a `Tool`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        dangerous: bool | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        if not _NAME.match(self.name):
            raise ConfigError(f"tool name {self.name!r} must match {_NAME.pattern}")
        desc, self.parameters = schema_from_function(fn)
        self.description = description or desc or self.name
        self.dangerous = bool(
            getattr(fn, _DANGEROUS_ATTR, False) if dangerous is None else dangerous
        )

    async def call(self, arguments: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**arguments)
        # A sync tool runs in a worker thread so the loop (and its timeouts) stay responsive;
        # on timeout the await is cancelled, the thread finishes on its own.
        return await in_daemon_thread(self.fn, **arguments)


async def in_daemon_thread(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` in its own daemon thread. Unlike ``asyncio.to_thread`` (the loop's
    default executor, joined by ``asyncio.run`` on exit), a call abandoned on timeout never
    keeps the process alive: a tool that sleeps for ten minutes must not hang the CLI."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():  # cancelled by the timeout
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def work() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = ctx.run(fn, **kwargs)
        except BaseException as exc:  # handed to the awaiting task, which reports it
            error = exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    name = f"tool-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=work, name=name, daemon=True).start()
    return await fut


def load_tools_file(path: str | Path) -> list[FunctionTool]:
    """Every public top-level function defined in ``path`` with type hints and a docstring."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"tools file not found: {path}")
    mod_name = f"loopstack_tools_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import tools file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"tools file {path} failed to import: {exc!r}") from exc
    dangerous = set(getattr(module, "DANGEROUS", set()) or set())
    tools: list[FunctionTool] = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(obj):
            continue
        if obj.__module__ != mod_name or not obj.__doc__:
            continue
        sig = inspect.signature(obj)
        hinted = all(
            p.annotation is not inspect.Parameter.empty
            for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )
        if not hinted:
            continue
        flag = True if name in dangerous else None
        tools.append(FunctionTool(obj, dangerous=flag))
    if not tools:
        raise ConfigError(f"{path} defines no public function with type hints and a docstring")
    return tools


# --- results -------------------------------------------------------------------------------


def _json_len(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


_MIN_CHARS = 120  # below this a value is only a summary line


def trim(data: Any, max_chars: int, max_items: int) -> Any:
    """Bound any JSON value to ``max_chars`` characters of JSON (and lists to ``max_items``
    rows), the summary header included. What was cut is said first, in a ``summary`` key:

    * a list: ``{"summary": "42 rows, showing the first 20", "rows": [...]}``;
    * a string: ``{"summary": "9000 characters, showing the first 3900", "text": "..."}``;
    * an object: its own keys, after a ``summary`` (``"trimmed"`` when it has a ``summary``
      key of its own) saying how many keys are shown and which values were shortened:
      ``{"summary": "1000 keys, showing the first 310", "k0": 0, ...}``.

    Nested values are trimmed the same way, each within its share of the limit.
    """
    max_chars = max(max_chars, _MIN_CHARS)
    out = _trim(data, max_chars, max_items)
    if _json_len(out) <= max_chars:
        return out
    # the last resort for whatever the rules above could not bound: the JSON text, cut
    text = json.dumps(data, ensure_ascii=False, default=str)
    return _cut_text(text, max_chars, what="characters of JSON")


def _cut_text(text: str, max_chars: int, *, what: str = "characters") -> dict[str, Any]:
    keep = max(0, max_chars - 80)
    while True:
        out = {"summary": f"{len(text)} {what}, showing the first {keep}", "text": text[:keep]}
        over = _json_len(out) - max_chars
        if over <= 0 or keep == 0:
            return out
        keep = max(0, keep - max(over, 1))


def _trim(data: Any, max_chars: int, max_items: int) -> Any:
    if isinstance(data, list):
        return _trim_list(data, max_chars, max_items)
    if isinstance(data, dict):
        return _trim_dict(data, max_chars, max_items)
    if isinstance(data, str) and _json_len(data) > max_chars:
        return _cut_text(data, max_chars)
    return data


def _trim_list(data: list[Any], max_chars: int, max_items: int) -> Any:
    n = len(data)
    if n <= max_items and _json_len(data) <= max_chars:
        return data
    keep = min(n, max_items)
    room = max_chars - 60  # the header
    share = max(_MIN_CHARS, room // max(1, keep))
    rows = [_trim(r, share, max_items) for r in data[:keep]]
    while keep > 0 and _json_len(rows[:keep]) > room:
        keep = max(0, keep // 2) if keep > 8 else keep - 1
    if keep == 0:  # not even one row fits whole: one row, cut to the room left
        rows, keep = [_trim(data[0], max(_MIN_CHARS, room - 4), max_items)], 1
    return {"summary": f"{n} rows, showing the first {keep}", "rows": rows[:keep]}


def _trim_dict(data: dict[str, Any], max_chars: int, max_items: int) -> Any:
    size = {k: _json_len(k) + 2 + _json_len(v) for k, v in data.items()}  # '"k": v'
    total = 2 + sum(size.values()) + 2 * max(0, len(size) - 1)  # braces, ", " between
    if total <= max_chars:
        return data
    n = len(data)
    head = next(h for h in ("summary", "trimmed", "_trimmed", "") if h not in data)
    room = max_chars - 160  # the header: counts, and the names of shortened values
    out = dict(data)
    shortened: list[str] = []
    # 1. every large value (container or long string) cut to an equal share of the room,
    # the largest first, until the object fits (sizes kept up to date, not re-measured)
    big = {k for k, v in out.items() if isinstance(v, list | dict | str) and size[k] > _MIN_CHARS}
    small = sum(size[k] + 2 for k in out if k not in big)
    share = max(_MIN_CHARS, (room - small) // max(1, len(big)) - 8)
    for k in sorted(big, key=lambda k: -size[k]):
        if total <= room:
            break
        if size[k] - _json_len(k) - 2 > share:
            shortened.append(_describe(k, out[k]))
            out[k] = _trim(out[k], share, max_items)
            new = _json_len(k) + 2 + _json_len(out[k])
            total, size[k] = total - size[k] + new, new
    # 2. still too long (many keys): the first keys that fit
    shown = n
    if total > room:
        used, shown = 2, 0
        for k in out:
            if used + size[k] + 2 > room:
                break
            used, shown = used + size[k] + 2, shown + 1
        out = dict(list(out.items())[:shown])
    parts = [f"{n} keys" + (f", showing the first {shown}" if shown < n else "")]
    if shortened:
        names = ", ".join(shortened[:4])
        more = f" and {len(shortened) - 4} more" if len(shortened) > 4 else ""
        parts.append(f"shortened: {names}{more}")
    return {head: "; ".join(parts), **out}


def _describe(key: str, value: Any) -> str:
    name = key if len(key) <= 24 else key[:21] + "..."
    if isinstance(value, list):
        return f"{name} ({len(value)} rows)"
    if isinstance(value, dict):
        return f"{name} ({len(value)} keys)"
    return f"{name} ({len(value)} characters)"


def _jsonable(data: Any) -> Any:
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return json.loads(json.dumps(data, default=str))


class ToolRegistry:
    """Tools by name, in groups; ``mount`` picks the groups (and allowlist) for one task."""

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        max_result_chars: int = 4000,
        max_result_items: int = 20,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._groups: dict[str, str] = {}
        self._validators: dict[str, Any] = {}
        self.retry: dict[
            str, RetryPolicy
        ] = {}  # per tool name or pattern (loopstack.agent.tools.retry)
        self.max_result_chars = max_result_chars
        self.max_result_items = max_result_items
        for t in tools:
            self.add(t)

    def add(
        self, tool: Tool | Callable[..., Any], *, group: str = "default", replace: bool = False
    ) -> Tool:
        """Register a `Tool` object or a typed function (wrapped as `FunctionTool`)."""
        t: Tool = tool if isinstance(tool, Tool) else FunctionTool(tool)  # type: ignore[arg-type]
        if t.name in self._tools and not replace:
            raise ConfigError(f"two tools are named {t.name!r}")
        self._tools[t.name] = t
        self._groups[t.name] = group
        self._validators.pop(t.name, None)
        return t

    def add_all(
        self, tools: Iterable[Tool | Callable[..., Any]], *, group: str = "default"
    ) -> None:
        for t in tools:
            self.add(t, group=group)

    def function(self, *, group: str = "default", dangerous: bool = False) -> Any:
        """Decorator: ``@registry.function()`` registers a typed function."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(FunctionTool(fn, dangerous=dangerous), group=group)
            return fn

        return deco

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool:
        if name not in self._tools:
            raise ToolNotAllowed(f"no tool named {name!r}")
        return self._tools[name]

    def names(self, groups: Iterable[str] | None = None) -> list[str]:
        wanted = None if groups is None else set(groups)
        return [n for n in self._tools if wanted is None or self._groups[n] in wanted]

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n, g in self._groups.items():
            out.setdefault(g, []).append(n)
        return out

    def mount(
        self, groups: Iterable[str] | None = None, *, allow: Iterable[str] | None = None
    ) -> ToolRegistry:
        """A registry with only these groups' tools, narrowed to ``allow`` when given."""
        allowed = None if allow is None else set(allow)
        sub = ToolRegistry(
            max_result_chars=self.max_result_chars, max_result_items=self.max_result_items
        )
        for n in self.names(groups):
            if allowed is None or n in allowed:
                sub.add(self._tools[n], group=self._groups[n])
        sub.retry = dict(self.retry)
        return sub

    def openai_tools(self, allow: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The ``tools`` request field for the mounted (and allowed) tools."""
        allowed = None if allow is None else set(allow)
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in self._tools.values()
            if allowed is None or t.name in allowed
        ]

    def validate(self, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
        """Parse and validate arguments against the tool's schema (ToolArgumentsError)."""
        tool = self.get(name)
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(f"arguments are not JSON: {exc}") from exc
        if not isinstance(args, dict):
            raise ToolArgumentsError("arguments must be a JSON object")
        validator = self._validators.get(name)
        if validator is None:  # checking the schema itself is the costly part: once per tool
            cls = jsonschema.validators.validator_for(tool.parameters)
            cls.check_schema(tool.parameters)
            validator = self._validators[name] = cls(tool.parameters)
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(args))
            if error is not None:
                raise error
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
            raise ToolArgumentsError(f"{where}: {exc.message}") from exc
        return args

    async def execute(
        self, name: str, arguments: dict[str, Any] | str, *, timeout_s: float | None = 30.0
    ) -> ToolResult:
        """Validate, call under a timeout (cancelling on expiry), wrap and trim. Never raises
        for a tool's own failure: that becomes ``ToolResult(status="error")``."""
        try:
            args = self.validate(name, arguments)
            tool = self._tools[name]
            try:
                data = await asyncio.wait_for(tool.call(args), timeout=timeout_s)
            except TimeoutError as exc:
                raise ToolTimeout(f"{name} ran past its {timeout_s:g} s timeout") from exc
        except AgentError as exc:
            return ToolResult("error", error=error_body(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the tool's own failure goes back to the model
            err = ToolError(f"{type(exc).__name__}: {exc}")
            return ToolResult("error", error=error_body(err))
        data = trim(_jsonable(data), self.max_result_chars, self.max_result_items)
        return ToolResult("ok", data=data)


def loads_arguments(arguments: str) -> dict[str, Any]:
    """A call's arguments as a dict, whatever the model wrote (``_raw`` when not JSON)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def result_summary(result: ToolResult) -> str:
    """One line for traces and plans: the error, the result's ``summary``, or its start."""
    if result.status == "error":
        err = result.error or {}
        return f"{err.get('type', 'error')}: {err.get('message', '')}"[:200]
    data = result.data
    if isinstance(data, dict) and "summary" in data:
        return str(data["summary"])
    if isinstance(data, list):
        return f"{len(data)} items"
    return json.dumps(data, ensure_ascii=False, default=str)[:200]
