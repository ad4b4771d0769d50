"""kill -9 during batch writes: every committed record survives and the index catches up."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory import AsyncMemoryStore, HashingEmbedder
from memory.index import shard_name

WRITER = Path(__file__).with_name("memory_crash_writer.py")


def _run_and_kill(db: Path, seed: int, wait_s: float) -> list[dict[str, object]]:
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(db), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # at least one batch committed before the kill
    assert first, proc.stderr.read() if proc.stderr else "writer died"
    time.sleep(wait_s)
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    lines = [first, *rest.splitlines()]
    # A line cut by the kill was never fully reported, so it does not count as committed.
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_sigkill_loses_nothing_committed(tmp_path: Path, seed: int) -> None:
    db = tmp_path / "crash.db"
    committed: list[dict[str, object]] = []
    for round_ in range(2):  # kill, reopen and write more, kill again
        committed += _run_and_kill(db, seed * 10 + round_, random.Random(seed).uniform(0.3, 1.2))
    assert len(committed) >= 2
    st = AsyncMemoryStore(db, embedder=HashingEmbedder())
    await st.open()
    stats = await st.stats()
    assert stats["index_vectors"] == stats["active"]  # index caught up with the ledger
    assert stats["active"] >= 32 * len(committed)  # the last, unreported batch may be there too
    emb = HashingEmbedder()
    for batch in committed:
        user = str(batch["user"])
        ids = list(batch["ids"])  # type: ignore[call-overload]
        texts = list(batch["texts"])  # type: ignore[call-overload]
        for rid, text in zip(ids, texts, strict=True):
            rec = await st.get(rid, user_id=user)
            assert rec.text == text
        # every committed record is reachable through the index
        vecs = await emb.embed(texts[:4])
        for rid, v in zip(ids[:4], vecs, strict=True):
            top = st.index.search(shard_name(user), v[None, :], 1)
            assert top and top[0][0] == (await st.get(rid, user_id=user)).rowid
    await st.close()
