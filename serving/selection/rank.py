"""Tool retrieval: rank the tools offered to a model by relevance to the request.

Small models pick the wrong tool when many are offered (the first listed, most often), and
call one where none fits. Retrieval over the tool descriptions, as RAG-MCP and Toolshed do,
narrows the choice before the model sees it. This module is the one ranking used by the
server's opt-in extension ``loopstack.tool_rank`` (`serving.selection.requests`), which the agent
runtime's ranked selection asks for (`agent.core.selection`); it depends only on an `Embedder`.

* A tool's *document* is its name (split into words), description and parameter names (with
  their descriptions and enum values, cut), as `tool_document` writes it.
* Its vector is computed once per distinct tool (the key is a hash of its JSON) and cached,
  so an agent that re-sends the same tools every step embeds only the query.
* The score is the cosine of query and document (dense) plus ``keyword_weight`` times a
  BM25-style score of the query's words in the document, divided by the best such score
  in the set (keyword recall: exact identifiers, such as a region or a file name, that a
  small embedding model blurs).
* Ties keep the order as given, so a ranking is a pure function of (query, tools).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Embedder", "RankedTool", "ToolRanker", "tool_document", "tool_key"]


class Embedder(Protocol):
    """Texts to unit-norm float32 vectors, one row each (the server's embedding model)."""

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    "a an the of to in on for and or with by from at is are be it this that what which how "
    "me my you your i we our please can could would use using get show tell give do does "
    "not no any all some as into about".split()
)
_DOC_CHARS = 1200  # the embedder reads ~256 word pieces: more is noise for MiniLM


def _words(text: str) -> list[str]:
    """Lower-case words of `text`, identifiers split (``get_weather``, ``listFiles``)."""
    return [w.lower() for w in _WORD.findall(text)]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return fn if isinstance(fn, dict) else {}


def tool_key(tool: dict[str, Any]) -> str:
    """The cache key of one tool: a hash of its JSON (name, description and schema)."""
    blob = json.dumps(_function(tool), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def tool_document(tool: dict[str, Any]) -> str:
    """The text a tool is retrieved by: name words, description, parameter names."""
    fn = _function(tool)
    name = str(fn.get("name", ""))
    parts = [" ".join(_words(name)), str(fn.get("description") or "")]
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if isinstance(props, dict):
        fields = []
        for pname, sub in props.items():
            text = " ".join(_words(str(pname)))
            if isinstance(sub, dict):
                desc = str(sub.get("description") or "")[:80]
                enum = sub.get("enum")
                if isinstance(enum, list):
                    desc += " (" + ", ".join(str(v) for v in enum[:8]) + ")"
                if desc:
                    text += f": {desc}"
            fields.append(text)
        if fields:
            parts.append("Parameters: " + "; ".join(fields))
    return ". ".join(p for p in parts if p)[:_DOC_CHARS]


@dataclass(frozen=True)
class RankedTool:
    """One tool's place in a ranking: its index in the list as given, and its scores."""

    index: int
    name: str
    score: float  # dense + keyword_weight * keyword
    dense: float  # cosine of query and document
    keyword: float  # 0..1, relative to the best keyword match in the set


class ToolRanker:
    """Ranks tools for a query; tool vectors cached by `tool_key` (LRU)."""

    def __init__(
        self, embedder: Embedder, *, keyword_weight: float = 0.3, cache_size: int = 4096
    ) -> None:
        self.embedder = embedder
        self.keyword_weight = keyword_weight
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = cache_size
        self.embedded = 0  # tool documents embedded so far (the cache's misses)

    async def _tool_vectors(self, tools: Sequence[dict[str, Any]]) -> np.ndarray:
        keys = [tool_key(t) for t in tools]
        missing = {k: t for k, t in zip(keys, tools, strict=True) if k not in self._vectors}
        if missing:
            docs = [tool_document(t) for t in missing.values()]
            vectors = await self.embedder.embed(docs)
            self.embedded += len(docs)
            for k, v in zip(missing, vectors, strict=True):
                self._vectors[k] = np.asarray(v, dtype=np.float32)
        for k in keys:
            self._vectors.move_to_end(k)
        out = np.stack([self._vectors[k] for k in keys])
        while len(self._vectors) > self._size:
            self._vectors.popitem(last=False)
        return out

    async def rank(self, query: str, tools: Sequence[dict[str, Any]]) -> list[RankedTool]:
        """`tools` (OpenAI tool objects or bare functions) ranked for `query`, best first."""
        if not tools:
            return []
        docs = await self._tool_vectors(tools)
        q = (await self.embedder.embed([query]))[0]
        dense = docs @ np.asarray(q, dtype=np.float32)
        keyword = _keyword_scores(query, [tool_document(t) for t in tools])
        ranked = [
            RankedTool(
                index=i,
                name=str(_function(t).get("name", "")),
                score=float(dense[i]) + self.keyword_weight * keyword[i],
                dense=float(dense[i]),
                keyword=keyword[i],
            )
            for i, t in enumerate(tools)
        ]
        return sorted(ranked, key=lambda r: (-r.score, r.index))


def _keyword_scores(query: str, docs: list[str]) -> list[float]:
    """BM25 (k1 = 1.2, b = 0.75) of the query's words in each document, over the set's own
    document frequencies, divided by the best score (0 when no word matches anywhere)."""
    terms = [w for w in dict.fromkeys(_words(query)) if w not in _STOP and len(w) > 1]
    bags = [Counter(_words(d)) for d in docs]
    if not terms or not bags:
        return [0.0] * len(docs)
    avg = sum(sum(b.values()) for b in bags) / len(bags) or 1.0
    n = len(bags)
    scores = []
    for bag in bags:
        length = sum(bag.values())
        s = 0.0
        for t in terms:
            tf = bag.get(t, 0)
            if not tf:
                continue
            df = sum(1 for b in bags if t in b)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            s += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / avg))
        scores.append(s)
    best = max(scores)
    return [s / best if best > 0 else 0.0 for s in scores]
