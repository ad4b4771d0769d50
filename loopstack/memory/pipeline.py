"""The load pipeline's pure parts: query terms (gate 1), merging (gate 2), re-scoring
(gate 3) and packing into a token budget (gate 4).

The store (``loopstack.memory.store``) does the I/O - embedding, FAISS, FTS5, the ledger - and hands
the results to these functions, which are deterministic and easy to test on their own.

Token counting is a tokenizer-free, CJK-aware estimate (``estimate_tokens``, from
``loopstack.memory.language``): per CJK character, digit, Latin word and symbol, fitted on the
served Qwen tokenizer. ``ceil(chars / 4)`` counted 1,000 characters of Chinese as 250 tokens where
the tokenizer gives ~600, so a 600-token budget let in over twice the Chinese text it meant.
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence

import loopstack.memory.language as language
from loopstack.memory.config import MemorySettings
from loopstack.memory.records import SOURCE_PRIOR, Candidate, MemoryType, Record
from loopstack.memory.trust import provenance, provenance_label, trust

__all__ = [
    "BLOCK_FOOTER",
    "BLOCK_HEADER",
    "doc_terms",
    "estimate_tokens",
    "freshness",
    "importance",
    "pack",
    "query_terms",
    "render_line",
    "score_candidates",
    "stem_terms",
    "type_for_task",
]

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    also any ever get got go going like lot really remember tell know think want please thing
    things yes yeah ok okay hey hi hello oh well much many one""".split()
)

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

BLOCK_HEADER = (
    "<memory>\n"
    "Remembered from earlier conversations; each entry says how it is known. Newer wins on "
    "conflict; the user's current words win over memory; an 'unverified' entry is a claim "
    "nobody confirmed, not a fact."
)
BLOCK_FOOTER = "</memory>"


def estimate_tokens(text: str) -> int:
    """Cheap token estimate (no tokenizer), CJK-aware: see ``loopstack.memory.language``."""
    return language.estimate_tokens(text)


# --- gate 1: query terms --------------------------------------------------------------------


def query_terms(text: str, *, limit: int = 16) -> list[str]:
    """Content words of a query, lower-cased, stopwords removed, order kept, unique."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if word not in STOPWORDS and (len(word) > 1 or word.isdigit()):
            seen.setdefault(word, None)
        if len(seen) >= limit:
            break
    return list(seen)


_stemmer = threading.local()


def stem_terms(terms: Sequence[str]) -> dict[str, str]:
    """Map each term to the form FTS5's ``porter unicode61`` tokenizer indexes it under, using
    a private in-memory FTS5 table (so the frequency lookup sees the same terms)."""
    conn: sqlite3.Connection | None = getattr(_stemmer, "conn", None)
    if conn is None:
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        conn.execute("CREATE VIRTUAL TABLE q USING fts5(t, tokenize='porter unicode61')")
        conn.execute("CREATE VIRTUAL TABLE qv USING fts5vocab(q, 'instance')")
        _stemmer.conn = conn
    out: dict[str, str] = {}
    for term in terms:
        conn.execute("INSERT INTO q(rowid, t) VALUES (1, ?)", (term,))
        row = conn.execute("SELECT term FROM qv LIMIT 1").fetchone()
        conn.execute("DELETE FROM q")
        if row is not None:
            out[term] = str(row[0])
    return out


def doc_terms(texts: Sequence[str], *, chunk: int = 500) -> list[set[str]]:
    """The distinct terms FTS5's ``porter unicode61`` tokenizer indexes each text under (the
    per-user keyword statistics count these); tokenized in batches through a private
    in-memory FTS5 table, about 50 us per text."""
    conn: sqlite3.Connection | None = getattr(_stemmer, "doc", None)
    if conn is None:
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        conn.execute(
            "CREATE VIRTUAL TABLE d USING fts5(t, tokenize='porter unicode61', detail=none)"
        )
        conn.execute("CREATE VIRTUAL TABLE dv USING fts5vocab(d, 'instance')")
        _stemmer.doc = conn
    out: list[set[str]] = [set() for _ in texts]
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        conn.executemany("INSERT INTO d(rowid, t) VALUES (?, ?)", list(enumerate(part, 1)))
        for doc, term in conn.execute("SELECT doc, term FROM dv"):
            out[start + int(doc) - 1].add(str(term))
        conn.execute("DELETE FROM d")
    return out


def prune_terms(
    terms: Sequence[str],
    df: dict[str, int],
    stems: dict[str, str],
    n_docs: int,
    max_df: float,
    posting_budget: int,
) -> list[str]:
    """Keep the rarest terms, up to ``posting_budget`` postings in all.

    FTS5 scores every document that matches any term, so the cost of a query is the sum of
    its terms' document frequencies (about 2 us per posting here). Rare terms carry most of
    the BM25 weight (IDF), so the rarest are kept first; terms in more than ``max_df`` of all
    records are never used, and none beyond the budget: a query made only of common terms
    gets no keyword side (the vector side still answers it). This bounds keyword recall
    at any store size.
    """
    limit = max(1.0, max_df * n_docs)
    usable = sorted(
        (df.get(stems.get(t, t), 0), i, t)
        for i, t in enumerate(terms)
        if df.get(stems.get(t, t), 0) <= limit
    )
    kept: list[tuple[int, str]] = []
    total = 0
    for d, i, t in usable:
        if total + d > posting_budget:
            break
        kept.append((i, t))
        total += d
    return [t for _, t in sorted(kept)]


_TYPE_HINTS: dict[MemoryType, tuple[str, ...]] = {
    MemoryType.PREFERENCE: ("prefer", "like", "favorite", "favourite", "style", "recommend"),
    MemoryType.PROCEDURE: ("how", "steps", "deploy", "install", "run", "build", "procedure"),
    MemoryType.DECISION: ("decide", "decision", "chose", "choose", "plan", "agreed"),
    MemoryType.EPISODE: ("when", "last", "yesterday", "trip", "happened", "did"),
}
# Chinese has no spaces: these are looked up as substrings of the task.
_TYPE_HINTS_ZH: dict[MemoryType, tuple[str, ...]] = {
    MemoryType.PREFERENCE: ("喜欢", "偏好", "最爱", "风格", "推荐", "口味"),
    MemoryType.PROCEDURE: ("怎么", "如何", "步骤", "部署", "安装", "运行", "构建", "流程"),
    MemoryType.DECISION: ("决定", "决策", "选择", "选了", "计划", "同意"),
    MemoryType.EPISODE: ("什么时候", "上次", "昨天", "旅行", "发生", "那次"),
}


def type_for_task(task: str | None) -> MemoryType | None:
    """Guess which memory type a task favours (gate 3's type boost); None when unclear."""
    if not task:
        return None
    words = set(_WORD.findall(task.lower()))
    best, hits = None, 0
    for mtype, hints in _TYPE_HINTS.items():
        n = sum(1 for h in hints if h in words)
        n += sum(1 for h in _TYPE_HINTS_ZH[mtype] if h in task)
        if n > hits:
            best, hits = mtype, n
    return best


# --- gate 3: re-scoring ----------------------------------------------------------------------


def importance(rec: Record) -> float:
    """0..1 from the source's trust, the record's weight and how often it was used."""
    prior = SOURCE_PRIOR[rec.source]
    weight = min(rec.weight, 2.0) / 2.0
    usage = min(1.0, math.log1p(rec.hits + rec.mentions - 1) / math.log1p(20))
    return 0.4 * prior + 0.3 * weight + 0.3 * usage


def freshness(rec: Record, now: float, half_life_days: float) -> float:
    """Half-life decay of age, counted from the later of creation and last use."""
    ref = max(rec.created_at, rec.last_used_at or 0.0)
    age_days = max(0.0, now - ref) / 86_400.0
    return float(0.5 ** (age_days / half_life_days))


def score_candidates(
    candidates: Iterable[Candidate],
    settings: MemorySettings,
    *,
    task_type: MemoryType | None = None,
    now: float | None = None,
    threshold: float | None = None,
    include_unverified: bool = False,
) -> list[Candidate]:
    """Gate 3: fill each candidate's score parts, apply the threshold and the trust floor,
    sort by score.

    ``similarity`` must already hold the cosine of query and record; ``keyword`` the BM25
    score normalised to 0..1 against the best keyword hit of this query. The score loses
    ``w_trust * (1 - trust)`` (see ``loopstack.memory.trust``); a record trusted less than
    ``trust_floor`` is dropped unless ``include_unverified``, and ranks after every record
    at or above the floor.
    """
    now = time.time() if now is None else now
    cut = settings.threshold if threshold is None else threshold
    out: list[Candidate] = []
    for c in candidates:
        c.provenance = provenance(c.record, settings.promote_after)
        c.trust = trust(c.record, settings.promote_after)
        c.importance = importance(c.record)
        c.freshness = freshness(c.record, now, settings.half_life_days)
        c.type_boost = settings.type_boost if task_type and c.record.type == task_type else 0.0
        c.relevance = c.similarity + settings.w_keyword * c.keyword
        c.score = (
            settings.w_similarity * c.relevance
            + settings.w_importance * c.importance
            + settings.w_freshness * c.freshness
            + c.type_boost
            - settings.w_trust * (1.0 - c.trust)
        )
        c.tokens = estimate_tokens(render_line(c.record, settings.promote_after))
        if c.trust < settings.trust_floor and not include_unverified:
            c.kept, c.reason = False, f"trust {c.trust:.2f} below floor {settings.trust_floor:.2f}"
        elif c.score < cut:
            c.kept, c.reason = False, f"below threshold {cut:.2f}"
        else:
            c.kept, c.reason = True, "above threshold"
        out.append(c)
    # Records at or above the trust floor rank before every record below it: an unverified
    # record never outranks a verified one, however relevant it looks.
    floor = settings.trust_floor
    out.sort(key=lambda c: (c.trust < floor, -c.score, -c.record.created_at))
    return out


# --- gate 4: packing --------------------------------------------------------------------------


def render_line(rec: Record, promote_after: int = 3) -> str:
    """``- [type | YYYY-MM-DD | provenance] text``, the text on one line."""
    text = " ".join(rec.text.split())
    return f"- [{rec.type.value} | {rec.day} | {provenance_label(rec, promote_after)}] {text}"


def pack(
    scored: Sequence[Candidate], budget_tokens: int, *, max_items: int, promote_after: int = 3
) -> tuple[list[Candidate], str, int]:
    """Gate 4: take candidates by score while they fit; skip (never cut) those that don't.

    Returns the kept items, the rendered block ('' when nothing is kept) and its tokens.
    """
    frame = estimate_tokens(BLOCK_HEADER) + estimate_tokens(BLOCK_FOOTER)
    used = frame
    kept: list[Candidate] = []
    for c in scored:
        if not c.kept:
            continue
        if len(kept) >= max_items:
            c.kept, c.reason = False, f"over max_items {max_items}"
            continue
        if used + c.tokens > budget_tokens:
            c.kept, c.reason = False, f"does not fit budget ({c.tokens} tokens, {used} used)"
            continue
        used += c.tokens
        c.reason = "packed"
        kept.append(c)
    if not kept:
        return [], "", 0
    # Oldest first inside the block, so "newer wins" reads top to bottom.
    ordered = sorted(kept, key=lambda c: c.record.created_at)
    lines = [render_line(c.record, promote_after) for c in ordered]
    block = "\n".join([BLOCK_HEADER, *lines, BLOCK_FOOTER])
    return kept, block, used
