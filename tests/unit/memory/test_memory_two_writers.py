"""Two stores on one ledger (as two processes would be): supersede decisions see the other
writer's commits even after it trimmed the change log (issue #10).

The writer replays the ledger's change log into its index inside the write transaction, so
its duplicate/supersede candidates are the ledger's active records. Another process that
saves its shard files and trims the log can leave this replica behind the trimmed part;
these tests build each such state deterministically and check that the second writer still
supersedes the first one's version (one active version of the fact). The last two cover
the shard files two processes share: a file replaced while being loaded, and a save that
another process's newer save must not break.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import loopstack.memory.index as index_module
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.index import ShardedIndex

OLD, NEW = "Project alpha status is green", "Project alpha status is red"


def _settings() -> MemorySettings:
    return MemorySettings(threshold=0.3, supersede_similarity=0.4, persist_every=1_000_000)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[AsyncMemoryStore, AsyncMemoryStore]]:
    """Two stores on one file; neither saves or trims on its own (the tests say when)."""
    a = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=_settings())
    b = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=_settings())
    yield a, b
    await a.close()
    await b.close()


async def _one_active_version(b: AsyncMemoryStore, old_id: str) -> None:
    new_id = await b.add(NEW, user_id="u1")
    active = [r.text for r in await b.list(user_id="u1", limit=100)]
    assert sum(t.startswith("Project alpha status") for t in active) == 1, active
    assert NEW in active
    assert [r.id for r in await b.history(new_id, user_id="u1")] == [old_id, new_id]


def _trim_log_without_mark(store: AsyncMemoryStore) -> None:
    """The log trimmed through the writer's position, ``compacted_upto`` not (yet) raised:
    what a reader saw between the two separate commits of the old ``persist``."""
    with store.ledger.write() as tx:
        tx.cur.execute("DELETE FROM changes WHERE seq <= ?", (store.replica.applied,))


async def test_replica_opened_on_an_empty_ledger_replays_a_trimmed_log(
    pair: tuple[AsyncMemoryStore, AsyncMemoryStore],
) -> None:
    """``b`` opened before anything was written (it has applied nothing); ``a`` then wrote
    and trimmed the log. ``b``'s index must still find ``a``'s version."""
    a, b = pair
    await b.open()
    await a.open()
    old_id = await a.add(OLD, user_id="u1")
    a.replica.persist(force=True)  # a saves its shards and trims the log
    assert int(a.ledger.get_meta("compacted_upto") or 0) > b.replica.applied == 0
    await _one_active_version(b, old_id)
    assert len(b.index) == b.ledger.count()


async def test_log_trimmed_before_compacted_upto_is_recorded(
    pair: tuple[AsyncMemoryStore, AsyncMemoryStore],
) -> None:
    """``a`` saved its shards and trimmed the log, but the mark is not there: ``b`` sees
    the gap in the log itself."""
    a, b = pair
    await a.open()
    await a.add("Unrelated note about the weekly planning call", user_id="u1")
    await b.open()
    assert b.replica.applied > 0
    old_id = await a.add(OLD, user_id="u1")
    a.index.save()
    a.index.write_manifest(a.replica.applied)
    _trim_log_without_mark(a)
    await _one_active_version(b, old_id)
    assert len(b.index) == b.ledger.count()


async def test_trimmed_log_without_files_rebuilds_from_the_ledger(
    pair: tuple[AsyncMemoryStore, AsyncMemoryStore],
) -> None:
    """The trimmed changes are in no shard file (the manifest does not reach them): ``b``
    rebuilds its index from the ledger inside the write transaction."""
    a, b = pair
    await a.open()
    await a.add("Unrelated note about the weekly planning call", user_id="u1")
    await b.open()
    old_id = await a.add(OLD, user_id="u1")
    _trim_log_without_mark(a)  # no save, no manifest
    await _one_active_version(b, old_id)
    assert len(b.index) == b.ledger.count()


async def test_unreadable_shard_file_rebuilds_from_the_ledger(
    pair: tuple[AsyncMemoryStore, AsyncMemoryStore],
) -> None:
    a, b = pair
    await a.open()
    await a.add("Unrelated note about the weekly planning call", user_id="u1")
    await b.open()
    old_id = await a.add(OLD, user_id="u1")
    a.replica.persist(force=True)
    assert b.replica.applied < int(a.ledger.get_meta("compacted_upto") or 0)
    for f in a.index_dir.glob("*.faiss"):
        f.write_bytes(b"not a faiss index")
    await _one_active_version(b, old_id)
    assert len(b.index) == b.ledger.count()


async def test_compacted_upto_is_never_lowered(tmp_path: Path) -> None:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=_settings())
    await st.open()
    for i in range(3):
        await st.add(f"note {i} about codeword{i}", user_id="u1")
    st.replica.persist(force=True)
    top = st.replica.applied
    assert st.ledger.get_meta("compacted_upto") == str(top)
    st.ledger.compact_changes(1)  # a process behind the others trims what it has
    assert st.ledger.get_meta("compacted_upto") == str(top)
    st.index.write_manifest(1)
    assert st.index.synced_seq() == top
    await st.close()


async def test_load_reads_the_newer_file_that_replaced_a_vanished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between listing the files and reading one, another process saved a newer file of
    that shard and removed the old one: the load reads the newer file, nothing is lost."""
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=_settings())
    await st.open()
    await st.add_many([f"note {i} about codeword{i}" for i in range(5)], user_id="u1")
    st.replica.persist(force=True)
    (path,) = st.index_dir.glob("*.faiss")  # one user: one shard file, <shard>.<seq>.faiss
    name, seq = path.name.split(".")[0], int(path.name.split(".")[1])
    real = index_module.faiss.read_index
    calls: list[str] = []

    def racing_read(f: str) -> object:
        calls.append(f)
        if len(calls) == 1:  # the other process's save lands now
            shutil.copy(path, path.with_name(f"{name}.{seq + 1}.faiss"))
            path.unlink()
            raise RuntimeError("could not open file: No such file or directory")
        return real(f)

    monkeypatch.setattr(index_module.faiss, "read_index", racing_read)
    unreadable = st.index.load()
    assert st.index.seqs.get(name) == seq + 1 and len(st.index) == 5
    assert unreadable == set()
    assert len(calls) == 2
    monkeypatch.undo()
    await st.close()


def test_saving_a_newer_shard_leaves_another_process_s_save_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process ``b`` is writing shard X at seq 5 when process ``a`` saves X at seq 10 and
    removes X's older files: ``b``'s temporary file is not one of them, so ``b``'s save
    completes, and a load reads the newest file."""
    dim, name = 8, "shard0"
    a, b = (ShardedIndex(tmp_path / "idx", dim=dim, model="m") for _ in range(2))
    vecs = np.eye(dim, dtype=np.float32)[:3]
    a.add(name, np.array([1, 2, 3], dtype=np.int64), vecs, 10)
    b.add(name, np.array([1, 2], dtype=np.int64), vecs[:2], 5)
    real = index_module.faiss.write_index

    def write_then_race(index: object, path: str) -> None:
        real(index, path)
        if ".5." in Path(path).name:  # b's file is written, not yet renamed: a saves now
            a.save()

    monkeypatch.setattr(index_module.faiss, "write_index", write_then_race)
    b.save()  # raised FileNotFoundError when a's clean-up removed b's temporary file
    monkeypatch.undo()
    fresh = ShardedIndex(tmp_path / "idx", dim=dim, model="m")
    assert fresh.load() == set()
    assert fresh.seqs[name] == 10 and len(fresh) == 3
