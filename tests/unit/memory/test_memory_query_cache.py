"""The query-vector cache (issue #58): a repeated question skips the embedder and gets the
vector a miss computes; least recently used out first; 0 turns it off; recall unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.embedding import QueryCache, Vectors


class Counting(HashingEmbedder):
    """The hashing embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    async def embed(self, texts: list[str]) -> Vectors:
        self.texts += texts
        return await super().embed(texts)


async def test_a_hit_is_the_vector_a_miss_computes() -> None:
    emb, cache = Counting(), QueryCache(2)
    first = await cache.vector(emb, "where does my  sister\nlive?")
    again = await cache.vector(emb, " where does my sister live? ")
    assert emb.texts == ["where does my sister live?"]  # embedded once, normalised
    assert np.array_equal(first, again) and first.shape == (emb.dim,)
    fresh = (await emb.embed(["where does my sister live?"]))[0]
    assert np.array_equal(first, fresh)
    again[:] = 0  # a caller's copy: the cached vector is not touched
    assert np.array_equal(await cache.vector(emb, "where does my sister live?"), first)
    assert (cache.hits, cache.misses) == (2, 1)


async def test_least_recently_used_goes_first_and_zero_is_off() -> None:
    emb, cache = Counting(), QueryCache(2)
    for q in ("a b", "c d", "a b", "e f", "a b", "c d"):
        await cache.vector(emb, q)
    assert emb.texts == ["a b", "c d", "e f", "c d"]  # "c d" was the oldest when "e f" came
    off = QueryCache(0)
    await off.vector(emb, "x y")
    await off.vector(emb, "x y")
    assert emb.texts[-2:] == ["x y", "x y"] and off.hits == 0


async def test_recall_is_the_same_with_and_without_the_cache(tmp_path: Path) -> None:
    out = []
    for size in (0, 16):
        emb = Counting()
        st = AsyncMemoryStore(
            tmp_path / f"m{size}.db",
            embedder=emb,
            settings=MemorySettings(query_cache_size=size, index_dir=tmp_path / f"r{size}"),
        )
        await st.add_many(
            ["My sister lives in Porto", "Standup is at 10am", "I prefer green tea"],
            user_id="u1",
        )
        before = len(emb.texts)
        got = [
            [
                (c.id, round(c.score, 6))
                for c in (
                    await st.recall("where does my sister live", user_id="u1", threshold=-math.inf)
                ).candidates
            ]
            for _ in range(3)
        ]
        await st.close()
        assert got[0] == got[1] == got[2]
        out.append(([t for _, t in got[0]], len(emb.texts) - before))
    (scores_off, embedded_off), (scores_on, embedded_on) = out
    assert scores_off == scores_on
    assert (embedded_off, embedded_on) == (3, 1)
