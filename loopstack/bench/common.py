"""What the benchmarks share (the load test, the serving benchmarks, the corpus builder):
corpus loading, client setup, call parsing, schema checks, small statistics and output.
Nothing here imports ``serving`` or ``agent``. Everything except ``make_client``/
``resolve_model``/``stream_chat`` is pure and unit-tested without a network."""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

JSON = dict[str, Any]
T = TypeVar("T")

CORPUS_PATH = Path(__file__).parent / "corpus" / "tool_schemas.jsonl"
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

# The switch our server honours to serve the same request without a grammar.
UNCONSTRAINED_EXTRA: JSON = {"loopstack": {"constrained": False}}


# ---------------------------------------------------------------------------
# corpus


def load_corpus(path: Path = CORPUS_PATH, limit: int | None = None) -> list[JSON]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return entries[:limit] if limit else entries


def tool_index(entries: Iterable[JSON]) -> dict[str, JSON]:
    """Tool name -> OpenAI tool object."""
    return {e["tool"]["function"]["name"]: e["tool"] for e in entries}


def pick_spread(entries: Sequence[T], n: int) -> list[T]:
    """``n`` entries spread evenly over the corpus (MCP tools at the end get their share)."""
    if n <= 0:
        return []
    if n >= len(entries):
        return list(entries)
    step = len(entries) / n
    return [entries[int(i * step)] for i in range(n)]


def tools_for(entry: JSON, index: dict[str, JSON], distractors: bool = True) -> list[JSON]:
    tools = [entry["tool"]]
    if distractors:
        tools += [index[name] for name in entry.get("distractors", []) if name in index]
    return tools


def tool_choice_for(mode: str, entry: JSON) -> Any:
    if mode == "named":
        return {"type": "function", "function": {"name": entry["tool"]["function"]["name"]}}
    if mode in ("required", "auto"):
        return mode
    raise ValueError(f"unknown mode {mode!r}")


# ---------------------------------------------------------------------------
# call parsing and checking


@dataclass
class CallCheck:
    name: str | None
    parses: bool
    valid: bool
    right_name: bool
    error: str | None = None


def check_call(
    name: str | None, arguments: Any, expected: str, schemas: dict[str, JSON]
) -> CallCheck:
    """Parse a call's arguments and validate them against the named tool's schema.

    ``arguments`` is the JSON text from ``tool_calls[i].function.arguments`` (a dict is
    accepted as already parsed).  A call naming a tool that was not offered is invalid.
    """
    from jsonschema import Draft202012Validator

    right = name == expected
    if isinstance(arguments, dict):
        args: Any = arguments
    else:
        try:
            args = json.loads(arguments or "")
        except (TypeError, ValueError) as exc:
            return CallCheck(name, False, False, right, f"json: {exc}")
    schema = schemas.get(name or "")
    if schema is None:
        return CallCheck(name, True, False, right, f"unknown tool {name!r}")
    errors = sorted(Draft202012Validator(schema).iter_errors(args), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "<root>"
        return CallCheck(name, True, False, right, f"schema at {where}: {err.message[:200]}")
    return CallCheck(name, True, True, right, None)


_TAG_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE_RE = re.compile(r"```(?:json|tool_call)?\s*(.*?)```", re.S)


def _first_json_object(text: str) -> Any:
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            return obj
        except ValueError:
            start = text.find("{", start + 1)
    return None


def calls_from_text(text: str | None) -> list[tuple[str | None, Any]]:
    """Lenient client-side reading of tool calls written as text.

    Finds ``<tool_call>{...}</tool_call>`` blocks, else ```json fences, else a bare JSON
    object, and keeps those shaped like ``{"name": ..., "arguments": {...}}`` (also
    ``parameters``).  Used only for the auxiliary ``text_calls`` count: the headline
    figures come from ``message.tool_calls``.
    """
    if not text:
        return []
    blocks = _TAG_RE.findall(text) or _FENCE_RE.findall(text) or [text]
    out: list[tuple[str | None, Any]] = []
    for block in blocks:
        obj = _first_json_object(block)
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if isinstance(item, dict) and "name" in item:
                args = item.get("arguments", item.get("parameters", {}))
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        pass
                out.append((item.get("name"), args))
    return out


# ---------------------------------------------------------------------------
# statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def safe_div(a: float, b: float) -> float:
    return a / b if b else math.nan


def bootstrap_ratio(
    num: Sequence[float],
    den: Sequence[float],
    stat: str = "median",
    iters: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio stat(num)/stat(den) with a 95 % percentile-bootstrap interval.

    ``num`` and ``den`` are paired (same prompt, interleaved), so pairs are resampled.
    """
    pairs = [(a, b) for a, b in zip(num, den, strict=False) if _finite(a) and _finite(b)]
    if not pairs:
        return (math.nan, math.nan, math.nan)
    agg = statistics.median if stat == "median" else statistics.fmean

    def ratio(sample: Sequence[tuple[float, float]]) -> float:
        return safe_div(agg([a for a, _ in sample]), agg([b for _, b in sample]))

    point = ratio(pairs)
    rng = random.Random(seed)
    boots = [ratio([rng.choice(pairs) for _ in pairs]) for _ in range(iters)]
    boots = [b for b in boots if _finite(b)]
    return (point, percentile(boots, 2.5), percentile(boots, 97.5))


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def write_json(path: str | Path, obj: Any) -> None:
    """Write results (NaN becomes null so the file is strict JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(obj), indent=1, default=str))


def finish(
    args: Any, bench: str, extra_config: JSON, results: JSON, transport_failures: int
) -> int:
    """Write ``--out`` (config without API keys, then `results`) and pick the exit code:
    2 when any request failed at the transport level, else 0."""
    if args.out:
        cfg = {k: v for k, v in vars(args).items() if "api_key" not in k}
        write_json(args.out, {"bench": bench, "config": cfg | extra_config, **results})
        print(f"wrote {args.out}")
    if transport_failures:
        print(f"{transport_failures} transport failures", file=sys.stderr)
        return 2
    return 0


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def fmt_num(v: float | None, digits: int = 2) -> str:
    """A figure for a table or a line, ``-`` when there is none."""
    return "-" if v is None else f"{v:.{digits}f}"


def parse_levels(text: str) -> list[float]:
    """A comma-separated list of positive numbers (a command-line option)."""
    import typer

    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"not a comma-separated list of numbers: {text!r}") from exc
    if not vals or any(v <= 0 for v in vals):
        raise typer.BadParameter("levels must be positive")
    return vals


def api_key_or_env(explicit: str | None) -> str:
    return explicit or os.environ.get("LOOPSTACK_API_KEY") or "EMPTY"


def fmt_pct(num: float, den: float) -> str:
    return f"{100.0 * num / den:5.1f}%" if den else "   n/a"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if j == 0:
            print("  ".join("-" * w for w in widths))


# ---------------------------------------------------------------------------
# network


def make_client(base_url: str, api_key: str, timeout: float = 600.0) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)


async def resolve_model(client: Any, model: str | None) -> str:
    if model:
        return model
    models = await client.models.list()
    if not models.data:
        raise RuntimeError("server lists no models")
    return str(models.data[0].id)


async def connect(
    base_url: str, api_key: str, client_timeout_s: float, model: str | None
) -> tuple[Any, str] | None:
    """A client and the model to ask (the first one listed when ``model`` is None), or None,
    said on stderr, when the server cannot be reached (the benchmarks then exit 2)."""
    client = make_client(base_url, api_key, client_timeout_s)
    try:
        return client, await resolve_model(client, model)
    except Exception as exc:
        print(f"cannot reach {base_url}: {error_text(exc)}", file=sys.stderr)
        return None


def is_transport_error(exc: BaseException) -> bool:
    """Connection refused / timeout (fatal) as opposed to an HTTP error answer."""
    import openai

    return isinstance(exc, openai.APIConnectionError)  # APITimeoutError is a subclass


def error_text(exc: BaseException) -> str:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {str(exc.message)[:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


@dataclass
class StreamResult:
    """Timings of one streamed chat completion (seconds, perf_counter based)."""

    ok: bool
    start: float = 0.0
    first_token: float | None = None
    end: float = 0.0
    completion_tokens: int = 0
    usage_reported: bool = False
    chunks: int = 0
    text: str = ""
    tool_args: str = ""
    finish_reason: str | None = None
    error: str | None = None
    transport_error: bool = False
    extra: JSON = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        return self.first_token - self.start if self.first_token is not None else math.nan

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def decode_rate(self) -> float:
        """Tokens after the first / time after the first token (tok/s)."""
        if self.first_token is None or self.completion_tokens < 2:
            return math.nan
        return safe_div(self.completion_tokens - 1, self.end - self.first_token)

    @property
    def e2e_rate(self) -> float:
        """Completion tokens / whole request wall time (tok/s)."""
        return safe_div(self.completion_tokens, self.wall)


async def stream_chat(client: Any, **kwargs: Any) -> StreamResult:
    """Stream one chat completion, recording TTFT, end time and usage."""
    res = StreamResult(ok=False, start=time.perf_counter())
    kwargs = dict(kwargs)
    kwargs["stream"] = True
    kwargs.setdefault("stream_options", {"include_usage": True})
    pieces = 0
    try:
        stream = await client.chat.completions.create(**kwargs)
        async for chunk in stream:
            res.chunks += 1
            if getattr(chunk, "usage", None) is not None and chunk.usage:
                res.completion_tokens = int(chunk.usage.completion_tokens or 0)
                res.usage_reported = True
            for choice in chunk.choices or []:
                delta = choice.delta
                piece = getattr(delta, "content", None) or ""
                for tc in getattr(delta, "tool_calls", None) or []:
                    fn = getattr(tc, "function", None)
                    if fn is not None:
                        piece += (fn.name or "") + (fn.arguments or "")
                        res.tool_args += fn.arguments or ""
                if piece:
                    pieces += 1
                    if res.first_token is None:
                        res.first_token = time.perf_counter()
                res.text += getattr(delta, "content", None) or ""
                if choice.finish_reason:
                    res.finish_reason = choice.finish_reason
        res.end = time.perf_counter()
        res.ok = True
        if not res.usage_reported:
            res.completion_tokens = pieces
            res.extra["token_count"] = "usage missing: counted non-empty chunks"
    except Exception as exc:  # recorded, summarised, and turned into the exit code
        res.end = time.perf_counter()
        res.error = error_text(exc)
        res.transport_error = is_transport_error(exc)
    return res
