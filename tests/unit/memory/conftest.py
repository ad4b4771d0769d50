"""Fixtures for the memory tests: real SQLite and FAISS in tmp dirs, a cheap embedder."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from memory import AsyncMemoryStore, HashingEmbedder, MemorySettings  # noqa: E402
from memory.embedding import MiniLMEmbedder  # noqa: E402


@pytest.fixture
def settings() -> MemorySettings:
    # The hashing embedder gives lower cosines than MiniLM: a lower threshold fits it.
    return MemorySettings(threshold=0.3, supersede_similarity=0.4, persist_every=50)


@pytest.fixture
async def store(tmp_path: Path, settings: MemorySettings) -> AsyncIterator[AsyncMemoryStore]:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=settings)
    await st.open()
    yield st
    await st.close()


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    emb = MiniLMEmbedder()
    emb.embed_sync(["warm up"])
    return emb
