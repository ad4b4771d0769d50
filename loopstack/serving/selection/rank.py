"""Tool retrieval: rank the tools offered to a model by relevance to the request.

Small models pick the wrong tool when many are offered (the first listed, most often), and
call one where none fits. Retrieval over the tool descriptions, as RAG-MCP and Toolshed do,
narrows the choice before the model sees it. This module is the one ranking used by the
server's opt-in extension ``loopstack.tool_rank`` (`loopstack.serving.selection.requests`), which
the agent runtime's ranked selection asks for (`loopstack.agent.core.selection`); it depends only on
an `Embedder`.

* A tool's *document* is its name (split into words), description and parameter names (with
  their descriptions and enum values, cut), as `tool_document` writes it. Examples of argument
  values in a parameter's description ("e.g., 'Asia/Tokyo'", "for example 2025-03") are left
  out: they say what a value looks like, not what the tool does, and a request naming that
  value (Tokyo) would pull the tool up (``convert_time`` above ``get_current_time``).
* Its vector is computed once per distinct tool (the key is a hash of its JSON) and cached,
  so an agent that re-sends the same tools every step embeds only the query.
* The score is the cosine of query and document (dense) plus ``keyword_weight`` times a
  BM25-style score of the query's words in the document, divided by the best such score
  in the set (keyword recall: exact identifiers, such as a region or a file name, that a
  small embedding model blurs).
* Ties keep the order as given, so a ranking is a pure function of (query, tools).
* The English embedder (MiniLM) ranks requests written mostly in Latin script; a request in
  another script (Chinese) is ranked by the ``multilingual`` embedder where one is given
  (multilingual-e5-small). A relevance floor is only meaningful on the scale it was set on,
  English requests against English tool descriptions: `floor_applies` says whether it is.
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

__all__ = [
    "Embedder",
    "RankedTool",
    "ToolRanker",
    "floor_applies",
    "latin_share",
    "tool_document",
    "tool_key",
]


class Embedder(Protocol):
    """Texts to unit-norm float32 vectors, one row each (the server's embedding model). An
    embedder with an ``embed_query`` method (e5's ``query:`` prefix) embeds the request by it."""

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    "a an the of to in on for and or with by from at is are be it this that what which how "
    "me my you your i we our please can could would use using get show tell give do does "
    "not no any all some as into about".split()
)
_DOC_CHARS = 1200  # the embedder reads ~256 word pieces: more is noise for MiniLM
# An example of a value in a parameter's description: "(e.g., 'America/New_York')", or from
# "for example" / "such as" / "e.g." to the end of its sentence ("Ticker, for example ACME.").
_EXAMPLE = re.compile(
    r"\s*\((?:e\.g\.|eg\.|for example|for instance|such as)[^)]*\)"
    r"|[,;]?\s*\b(?:e\.g\.|for example|for instance|such as)(?:\s|,|:).*?(?:\.(?=\s|$)|$)",
    re.I,
)
_LATIN = re.compile(r"[A-Za-z]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CJK_WEIGHT = 3  # one CJK character carries about as much as three Latin letters


def _words(text: str) -> list[str]:
    """Lower-case words of `text`, identifiers split (``get_weather``, ``listFiles``)."""
    return [w.lower() for w in _WORD.findall(text)]


def latin_share(text: str) -> float:
    """The share of `text`'s letters in Latin script (1.0 when it has none): ASCII letters
    against other letters, a CJK character counted as `_CJK_WEIGHT` letters."""
    latin = len(_LATIN.findall(text))
    cjk = len(_CJK.findall(text))
    other = sum(1 for ch in text if ch.isalpha() and not ch.isascii()) - cjk
    total = latin + _CJK_WEIGHT * cjk + other
    return latin / total if total else 1.0


def _drop_example(m: re.Match[str]) -> str:
    return "." if m.group(0).endswith(".") else ""


def floor_applies(query: str) -> bool:
    """Whether a relevance floor means what it was set to mean for `query`: the floor was
    chosen on English requests against English tool descriptions, and a request in another
    script scores far lower against them for the same fit (a Chinese request's right tool
    scores ~0.18 where its English twin's scores ~0.98: docs/benchmarks.md, "Selection
    defaults", "Asked in Chinese"). True when most of its letters are Latin."""
    return latin_share(query) >= 0.5


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
                desc = _EXAMPLE.sub(_drop_example, str(sub.get("description") or ""))[:80]
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
    """Ranks tools for a query; tool vectors cached by `tool_key` (LRU), per embedder.

    `embedder` ranks requests mostly in Latin script; `multilingual` (optional) the others
    (`floor_applies` is the test): without it, every request goes to `embedder`."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        multilingual: Embedder | None = None,
        keyword_weight: float = 0.3,
        cache_size: int = 4096,
    ) -> None:
        self.embedder = embedder
        self.multilingual = multilingual
        self.keyword_weight = keyword_weight
        self._vectors: dict[int, OrderedDict[str, np.ndarray]] = {}
        self._size = cache_size
        self.embedded = 0  # tool documents embedded so far (the caches' misses)

    def embedder_for(self, query: str) -> Embedder:
        """The embedder that ranks `query`: the multilingual one for a request mostly in
        another script than Latin, where there is one."""
        if self.multilingual is not None and not floor_applies(query):
            return self.multilingual
        return self.embedder

    async def _tool_vectors(
        self, embedder: Embedder, tools: Sequence[dict[str, Any]]
    ) -> np.ndarray:
        cache = self._vectors.setdefault(id(embedder), OrderedDict())
        keys = [tool_key(t) for t in tools]
        missing = {k: t for k, t in zip(keys, tools, strict=True) if k not in cache}
        if missing:
            docs = [tool_document(t) for t in missing.values()]
            vectors = await embedder.embed(docs)
            self.embedded += len(docs)
            for k, v in zip(missing, vectors, strict=True):
                cache[k] = np.asarray(v, dtype=np.float32)
        for k in keys:
            cache.move_to_end(k)
        out = np.stack([cache[k] for k in keys])
        while len(cache) > self._size:
            cache.popitem(last=False)
        return out

    async def rank(self, query: str, tools: Sequence[dict[str, Any]]) -> list[RankedTool]:
        """`tools` (OpenAI tool objects or bare functions) ranked for `query`, best first."""
        if not tools:
            return []
        embedder = self.embedder_for(query)
        docs = await self._tool_vectors(embedder, tools)
        embed_query = getattr(embedder, "embed_query", None) or embedder.embed
        q = (await embed_query([query]))[0]
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
