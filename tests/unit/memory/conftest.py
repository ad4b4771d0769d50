"""Fixtures for the memory tests: real SQLite, Postgres and FAISS in tmp dirs, a cheap embedder.

The contract suites override ``backend`` with ``params=BACKENDS`` so that every test using
``store`` runs on the SQLite ledger and on the Postgres ledger; the Postgres server is real,
started once per session in a temp dir (``loopstack.bench.memory.local_postgres``), one fresh schema
per test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.bench.memory.local_postgres import LocalPostgres  # noqa: E402
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings  # noqa: E402
from loopstack.memory.embedding import MiniLMEmbedder  # noqa: E402

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture
def settings() -> MemorySettings:
    # The hashing embedder gives lower cosines than MiniLM: a lower threshold fits it.
    return MemorySettings(threshold=0.3, supersede_similarity=0.4, persist_every=50)


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """One real PostgreSQL server for the session (stopped and removed at the end)."""
    with LocalPostgres(fsync=False) as pg:
        yield pg


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
def location(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh ledger: a SQLite path, or the URL of a fresh Postgres database."""
    if backend == "sqlite":
        yield str(tmp_path / "m.db")
        return
    pg: LocalPostgres = request.getfixturevalue("postgres")
    url = pg.new_schema()
    yield url
    pg.drop_schema(url)


@pytest.fixture
async def store(
    location: str, tmp_path: Path, settings: MemorySettings
) -> AsyncIterator[AsyncMemoryStore]:
    settings = settings.model_copy(update={"index_dir": tmp_path / "replica"})
    st = AsyncMemoryStore(location, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    yield st
    await st.close()


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    emb = MiniLMEmbedder()
    emb.embed_sync(["warm up"])
    return emb
