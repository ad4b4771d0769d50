"""The trace's answer to "why did it remember (or forget) that?".

Each run's trace starts with a ``start`` line: what the user asked (``input``), the memory block
exactly as it went into the system prompt (``memory_block``), and recall's decisions
(``recall``): every record that reached re-scoring, kept or dropped, with its score, trust and
tokens and a reason code::

    packed            kept: in the block
    low_trust         its trust is below the floor (unverified: never injected as a fact)
    below_threshold   its score is below the recall threshold (not relevant enough)
    over_budget       relevant, but it did not fit the memory token budget
    over_max_items    relevant, but the block already holds max_items records
    other             a reason memory gave that this list does not know (``detail`` says it)

Memory never imports the agent: `loopstack.memory.records.Recall` carries each candidate's verdict
(``Candidate.kept`` / ``reason``) and this module turns it into the trace's record.
``loopstack agent explain RUN`` prints it back (`render`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Literal

from loopstack.agent.core.state import AgentState

__all__ = ["ReasonCode", "explain_recall", "reason_code", "render", "run_start"]

logger = logging.getLogger(__name__)

ReasonCode = Literal[
    "packed", "low_trust", "below_threshold", "over_budget", "over_max_items", "other"
]
_CODES: tuple[tuple[re.Pattern[str], ReasonCode], ...] = (
    (re.compile(r"^packed\b|^above threshold\b"), "packed"),
    (re.compile(r"^trust .* below floor\b"), "low_trust"),
    (re.compile(r"^below threshold\b"), "below_threshold"),
    (re.compile(r"^does not fit budget\b"), "over_budget"),
    (re.compile(r"^over max_items\b"), "over_max_items"),
)
_TEXT_CHARS = 300


def reason_code(kept: bool, detail: str) -> ReasonCode:
    """The code of one candidate's verdict (memory's ``reason`` text as the detail)."""
    for pattern, code in _CODES:
        if pattern.search(detail):
            return "packed" if kept else ("other" if code == "packed" else code)
    return "packed" if kept else "other"


def explain_recall(rec: Any) -> dict[str, Any]:
    """A `loopstack.memory.records.Recall` as the trace's ``recall`` field: kept, then dropped."""
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for c in getattr(rec, "candidates", []):
        row = c.explain()
        entry = {
            "id": row["id"],
            "text": row["text"][:_TEXT_CHARS],
            "type": row["type"],
            "score": row["score"],
            "similarity": row["similarity"],
            "keyword": row["keyword"],
            "trust": row["trust"],
            "provenance": row["provenance"],
            "tokens": row["tokens"],
            "via": row["via"],
            "reason": reason_code(bool(row["kept"]), row["reason"]),
            "detail": row["reason"],
        }
        (kept if row["kept"] else dropped).append(entry)
    return {
        "query": getattr(rec, "query", ""),
        "tokens": getattr(rec, "tokens", 0),
        "kept": kept,
        "dropped": dropped,
    }


async def run_start(agent: Any, state: AgentState) -> dict[str, Any]:
    """Recall memory for the run (sets ``state.memory_block``) and return the trace's ``start``
    line. A memory link with ``recall_explained`` (loopstack.agent.run.longterm.StoreMemory) gives
    the decisions; any other gives the block only. A failed recall never fails the run."""
    t0 = time.perf_counter()
    recall: dict[str, Any] | None = None
    error = ""
    memory = agent.memory
    if memory is not None:
        try:
            explained = getattr(memory, "recall_explained", None)
            if explained is not None:
                rec = await explained(state.goal)
                state.memory_block = rec.block
                recall = explain_recall(rec)
            else:
                state.memory_block = await memory.recall(state.goal)
                recall = {"query": state.goal, "kept": [], "dropped": [], "opaque": True}
        except Exception as exc:  # memory is a help, never a reason to fail the run
            logger.warning("memory recall failed: %s", exc)
            error = f"{type(exc).__name__}: {exc}"
    line: dict[str, Any] = {
        "trace_id": f"{state.run_id}.{state.step}.start",
        "step": state.step,
        "type": "start",
        "latency_s": round(time.perf_counter() - t0, 6),
        "input": state.goal,
        "memory": "on" if memory is not None else "off",
        "memory_block": state.memory_block,
        "recall": recall,
    }
    if state.request:  # a worker: the user's request its task is part of
        line["request"] = state.request
    if error:
        line["recall_error"] = error
    return line


# --- reading it back -------------------------------------------------------------------


def _row(entry: dict[str, Any]) -> str:
    text = " ".join(str(entry.get("text", "")).split())
    if len(text) > 90:
        text = text[:87] + "..."
    return (
        f"  {entry.get('reason', '?'):<15} score {entry.get('score', 0):>7.3f}  "
        f"trust {entry.get('trust', 0):.2f}  {entry.get('tokens', 0):>3} tok  "
        f"[{entry.get('type', '')}] {text}"
        + (f"\n{'':<19}({entry['detail']})" if entry.get("reason") not in ("packed",) else "")
    )


def render(lines: list[dict[str, Any]]) -> str:
    """The start line(s) of a trace as text: input, injected block, kept and dropped."""
    starts = [x for x in lines if x.get("type") == "start"]
    if not lines:
        return "empty trace"
    run_id = lines[0].get("run_id", "?")
    if not starts:
        return f"run {run_id}: no start record (a trace written before explain existed)"
    out: list[str] = []
    for n, s in enumerate(starts, 1):
        head = f"run {run_id}" + (f", turn {n}" if len(starts) > 1 else "")
        out.append(f"{head}: memory {s.get('memory', '?')}")
        out.append(f"input: {s.get('input', '')}")
        if s.get("recall_error"):
            out.append(f"recall failed: {s['recall_error']}")
        block = s.get("memory_block") or ""
        out.append("memory block as injected:" if block else "memory block: (empty)")
        out.extend(f"  | {b}" for b in block.splitlines())
        recall = s.get("recall")
        if recall is None:
            continue
        if recall.get("opaque"):
            out.append("recall: this memory link does not explain its choices")
            continue
        kept, dropped = recall.get("kept", []), recall.get("dropped", [])
        out.append(
            f"recall for {recall.get('query', '')!r}: {len(kept)} kept, {len(dropped)} "
            f"dropped, {recall.get('tokens', 0)} tokens"
        )
        if kept:
            out.append("kept:")
            out.extend(_row(e) for e in kept)
        if dropped:
            out.append("dropped:")
            out.extend(_row(e) for e in dropped)
        if not kept and not dropped:
            out.append("  no record of this user came close to the input")
    final = next((x for x in reversed(lines) if x.get("type") == "final"), None)
    if final is not None:
        out.append(f"ended: {final.get('status')} ({final.get('reason')})")
    return "\n".join(out)
