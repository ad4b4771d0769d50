"""Traces: one JSONL file per run at ``$LOOPSTACK_HOME/traces/<run_id>.jsonl``.

Every line has ``run_id, trace_id, step, type, ts, latency_s``; ``type`` is one of
``start | model | tool | compaction | final | limit | error | plan``; the ``start`` line (one
per run or chat turn, first) holds the input, the memory block and recall's choices
(loopstack.agent.observe.explain). A worker's lines (loopstack.agent.run.team)
also carry ``parent_run_id`` and ``parent_trace_id``: the run and the tool-call step that
handed it the sub-task, so runs form a tree (`show_trace` prints it).
Model lines add ``prompt_tokens, completion_tokens, decision`` (``tool_calls`` |
``answer``); tool lines add ``name, arguments, status, result_summary, result_chars``.
A model step's ``trace_id`` is sent as ``x-request-id``, so the server's log lines for
that request carry the same id.

If ``opentelemetry`` is importable and an OTLP endpoint is configured, each line is also
exported as a span (attributes = the line's fields; ``register_otel_provider`` puts any
SDK ``TracerProvider`` behind an endpoint name, which is how the tests read spans back).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, TextIO

from loopstack.agent.core.state import (
    CompactionStep,
    ErrorStep,
    FinalStep,
    LimitStep,
    ModelStep,
    PlanStep,
    Step,
    ToolStep,
)

__all__ = [
    "Tracer",
    "children_of",
    "load_trace",
    "register_otel_provider",
    "show_trace",
    "step_line",
    "traces_dir",
]

logger = logging.getLogger(__name__)


def traces_dir() -> Path:
    home = Path(os.environ.get("LOOPSTACK_HOME", "~/.cache/loopstack")).expanduser()
    return home / "traces"


def step_line(run_id: str, step: Step) -> dict[str, Any]:
    """The JSONL record of one step."""
    base: dict[str, Any] = {
        "run_id": run_id,
        "trace_id": step.trace_id,
        "step": step.step,
        "ts": time.time(),
        "latency_s": round(step.latency_s, 6),
    }
    if isinstance(step, ModelStep):
        base |= {
            "type": "model",
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
            "decision": step.decision,
            "calls": [{"name": n, "arguments": a} for n, a in step.calls],
        }
        if step.text:
            base["text"] = step.text[:500]
    elif isinstance(step, ToolStep):
        base |= {
            "type": "tool",
            "name": step.name,
            "arguments": step.arguments,
            "status": step.status,
            "result_summary": step.summary,
            "result_chars": step.chars,
            "call_id": step.call_id,
            "attempts": step.attempts,
        }
        if step.error_type:
            base["error_type"] = step.error_type
        if step.retried:
            base["retried"] = list(step.retried)
    elif isinstance(step, CompactionStep):
        base |= {
            "type": "compaction",
            "dropped_messages": step.dropped_messages,
            "tokens_before": step.tokens_before,
            "summary": step.summary[:500],
        }
    elif isinstance(step, LimitStep):
        base |= {"type": "limit", "reason": step.reason, "detail": step.detail}
    elif isinstance(step, FinalStep):
        base |= {
            "type": "final",
            "status": step.status,
            "reason": step.reason,
            "forced": step.forced,
            "answer": step.answer[:2000],
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
        }
        if step.repairs:
            base["repairs"] = list(step.repairs)
        if step.arms:
            base["arms"] = dict(step.arms)
    elif isinstance(step, ErrorStep):
        base |= {"type": "error", "message": step.message[:1000]}
    elif isinstance(step, PlanStep):
        base |= {
            "type": "plan",
            "kind": step.kind,
            "items": list(step.items),
            "detail": step.detail,
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
        }
    return base


class Tracer:
    """Appends step lines to the run's file (and to OpenTelemetry when configured)."""

    def __init__(
        self,
        run_id: str,
        directory: Path | None = None,
        *,
        otel_endpoint: str | None = None,
        parent: tuple[str, str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.parent = (
            {} if parent is None else {"parent_run_id": parent[0], "parent_trace_id": parent[1]}
        )
        self.path = (directory or traces_dir()) / f"{run_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")
        self._otel = _otel_tracer(otel_endpoint)

    def record(self, step: Step) -> dict[str, Any]:
        line = step_line(self.run_id, step) | self.parent
        if self._file is not None:
            self._file.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
            self._file.flush()
        if self._otel is not None:
            _export_span(self._otel, line)
        return line

    def record_line(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A line that is not a step (the run's ``start`` line, loopstack.agent.observe.explain)."""
        line = {"run_id": self.run_id, "ts": time.time(), "latency_s": 0.0} | fields
        line |= self.parent
        if self._file is not None:
            self._file.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
            self._file.flush()
        if self._otel is not None:
            _export_span(self._otel, line)
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# --- OpenTelemetry (optional) -------------------------------------------------------------

_PROVIDERS: dict[str, Any] = {}


def _otel_tracer(endpoint: str | None) -> Any:
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("opentelemetry-sdk is not installed: OTel export is off")
        return None
    if endpoint not in _PROVIDERS:
        provider = TracerProvider(resource=Resource.create({"service.name": "loopstack-agent"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        _PROVIDERS[endpoint] = provider
    return _PROVIDERS[endpoint].get_tracer("loopstack.agent")


def _export_span(tracer: Any, line: dict[str, Any]) -> None:
    end = int(line["ts"] * 1e9)
    start = end - int(line["latency_s"] * 1e9)
    span = tracer.start_span(f"agent.{line['type']}", start_time=start)
    for k, v in line.items():
        span.set_attribute(
            f"loopstack.{k}", v if isinstance(v, str | int | float | bool) else json.dumps(v)
        )
    span.end(end_time=end)


def register_otel_provider(endpoint: str, provider: Any) -> None:
    """Export to ``provider`` (an SDK ``TracerProvider``) for runs configured with
    ``otel_endpoint=endpoint``; e.g. one with an ``InMemorySpanExporter``."""
    _PROVIDERS[endpoint] = provider


# --- reading ------------------------------------------------------------------------------


def load_trace(run: str) -> list[dict[str, Any]]:
    """Lines of a run: ``run`` is a run id (prefix is enough) or a path."""
    path = Path(run)
    if not path.is_file():
        d = traces_dir()
        matches = sorted(d.glob(f"{run}*.jsonl")) if d.is_dir() else []
        if not matches:
            raise FileNotFoundError(f"no trace for {run!r} in {d}")
        path = matches[-1]
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _detail(line: dict[str, Any]) -> str:
    t = line["type"]
    if t == "model":
        tok = f"{line.get('prompt_tokens', 0)}+{line.get('completion_tokens', 0)} tok"
        if line.get("decision") == "tool_calls":
            calls = ", ".join(
                f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})"
                for c in line.get("calls", [])
            )
            return f"{tok}  -> {calls}"
        return f"{tok}  -> text: {line.get('text', '')[:120]}"
    if t == "tool":
        args = json.dumps(line.get("arguments", {}), ensure_ascii=False)
        return f"{line['name']}({args}) {line['status']}: {line.get('result_summary', '')[:120]}"
    if t == "compaction":
        return f"dropped {line['dropped_messages']} messages at {line['tokens_before']} tokens"
    if t == "limit":
        return f"{line['reason']}: {line.get('detail', '')}"
    if t == "final":
        return f"{line['status']} ({line['reason']}): {line.get('answer', '')[:200]}"
    if t == "start":
        recall = line.get("recall") or {}
        kept, dropped = len(recall.get("kept", [])), len(recall.get("dropped", []))
        mem = f"memory: {kept} kept, {dropped} dropped" if recall else f"memory {line['memory']}"
        return f"input: {str(line.get('input', ''))[:120]}  ({mem}; `agent explain` shows why)"
    return str(line.get("message", ""))


def children_of(run_id: str, directory: Path | None = None) -> list[list[dict[str, Any]]]:
    """The traces of the workers a run handed sub-tasks to (their lines name it parent)."""
    d = directory or traces_dir()
    out = []
    for path in sorted(d.glob("*.jsonl")) if d.is_dir() else []:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
        if first.strip() and json.loads(first).get("parent_run_id") == run_id:
            out.append(load_trace(str(path)))
    return out


def _summary_of(lines: list[dict[str, Any]], children: list[list[dict[str, Any]]]) -> str:
    """A run node: status, wall time and cost (its own and its workers', recursively)."""
    final = next((x for x in reversed(lines) if x["type"] == "final"), None)
    status = f"{final['status']} ({final['reason']})" if final else "unfinished"
    wall = max(x["ts"] for x in lines) - min(x["ts"] - x["latency_s"] for x in lines)
    tok = calls = tools = 0
    for run_lines in [lines, *children]:
        tok += sum(x.get("prompt_tokens", 0) + x.get("completion_tokens", 0) for x in run_lines)
        calls += sum(1 for x in run_lines if x.get("prompt_tokens", 0) > 0)
        tools += sum(
            1 for x in run_lines if x["type"] == "tool" and x.get("error_type") != "repeated_call"
        )
    return f"{status}  {wall:.2f} s  {tok} tok  {calls} model calls  {tools} tool calls"


def _add_run(node: Any, lines: list[dict[str, Any]], directory: Path | None, depth: int) -> None:
    from rich.text import Text

    colors = {"model": "cyan", "tool": "green", "final": "bold", "limit": "yellow", "error": "red"}
    by_parent: dict[str, list[list[dict[str, Any]]]] = {}
    for kid in children_of(lines[0]["run_id"], directory) if depth < 8 else []:
        by_parent.setdefault(kid[0].get("parent_trace_id", ""), []).append(kid)
    for x in lines:
        kind = x["type"]
        detail = _plan_detail(x) if kind == "plan" else _detail(x)
        branch = node.add(
            Text.assemble(
                f"{x['trace_id']} ",
                (kind, colors.get(kind, "")),
                f" {x['latency_s']:.3f}s  {detail}",
            )
        )
        for child in by_parent.get(x["trace_id"], []):
            grand = children_of(child[0]["run_id"], directory)
            sub = branch.add(
                Text(f"worker run {child[0]['run_id']}: {_summary_of(child, grand)}", "magenta")
            )
            _add_run(sub, child, directory, depth + 1)


def _plan_detail(line: dict[str, Any]) -> str:
    items = "; ".join(f"{i['status']}: {i['goal']}" for i in line.get("items", []))
    why = f" ({line['detail']})" if line.get("detail") else ""
    return f"{line.get('kind', 'plan')}{why}: {items}"[:400]


def show_trace(run: str, console: Any = None, directory: Path | None = None) -> None:
    """Print a run as a tree: its steps, and under each worker call the worker's run, each
    node with its status, time and cost."""
    from rich.console import Console
    from rich.text import Text
    from rich.tree import Tree

    lines = load_trace(run)
    console = console or Console()
    if not lines:
        console.print(f"run {run}: empty trace")
        return
    run_id = lines[0]["run_id"]
    kids = children_of(run_id, directory)
    tree = Tree(Text(f"run {run_id}: {_summary_of(lines, kids)}", "bold"))
    _add_run(tree, lines, directory, 0)
    console.print(tree)
