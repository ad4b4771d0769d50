"""Child process for test_memory_pg_servers.py: one app server on a shared Postgres ledger.

Not a test module (no ``test_`` prefix). Usage::

    python memory_pg_app.py URL REPLICA_DIR SEED write N     # N adds (0: forever)
    python memory_pg_app.py URL REPLICA_DIR[,REPLICA_DIR...] SEED verify < acks.jsonl

``write`` adds facts for a user shared by every server and for one of its own: the same fact
from several servers (one active record must remain), a new status of one project (the old
one must be superseded, on whichever server it was written) and unique notes. Each
acknowledged add is printed as a JSON line only after ``add`` returned; a failed add prints
``{"error": ...}`` and the server goes on. Every few adds it recalls for one of its users
and counts items of another user (``{"xuser": n}`` at the end).

``verify`` reads acknowledged adds on stdin and, for each replica folder in turn (one
process for all: an interpreter start each cost more than the checks), opens a server on it
and checks each add is in the ledger for its user and, when still active, recallable
through that server's replica; one result line per replica.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.exceptions import LedgerError

SHARED = "shared-user"
PROJECTS = ["alpha", "bravo", "charlie"]
STATES = ["green", "amber", "red", "blocked", "shipped", "paused"]


def out(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def text_for(rng: random.Random, i: int, seed: int) -> str:
    r = rng.random()
    if r < 0.4:  # the same fact from every server
        k = rng.randrange(8)
        return f"token{k}a token{k}b token{k}c token{k}d"
    if r < 0.7:  # same subject, new value
        return f"Project {rng.choice(PROJECTS)} status is {rng.choice(STATES)}"
    return f"note {seed}-{i} " + " ".join(f"w{rng.randrange(10**6)}" for _ in range(5))


async def write(st: AsyncMemoryStore, seed: int, n: int) -> None:
    rng = random.Random(seed)
    own = f"own-{seed}"
    xuser = i = 0
    while n == 0 or i < n:
        user = rng.choice([SHARED, own])
        text = text_for(rng, i, seed)
        try:
            rid = await st.add(text, user_id=user)
            out({"user": user, "id": rid, "text": text})
            i += 1
            if i % 4 == 0:
                q = rng.choice([SHARED, own])
                rec = await st.recall(text, user_id=q, threshold=-1e9, include_unverified=True)
                xuser += sum(c.record.user_id != q for c in rec.candidates)
        except LedgerError as exc:
            out({"error": str(exc)})
            await asyncio.sleep(0.2)
    out({"xuser": xuser})


async def verify(st: AsyncMemoryStore, acks: list[dict[str, str]]) -> None:
    missing, lost, checked = [], [], 0
    for row in acks:
        rec = st.ledger.get(row["id"])
        if rec is None or rec.user_id != row["user"]:
            lost.append(row["id"])
            continue
        checked += 1
        if rec.superseded_by is None:
            r = await st.recall(
                rec.text, user_id=row["user"], threshold=-1e9, include_unverified=True
            )
            if row["id"] not in [c.id for c in r.candidates]:
                missing.append(row["id"])
    stats = await st.stats()
    out(
        {
            "checked": checked,
            "missing": missing,
            "lost": lost,
            "index_vectors": stats["index_vectors"],
            "active": stats["active"],
        }
    )


def _store(url: str, replica: str, seed: int) -> AsyncMemoryStore:
    settings = MemorySettings(
        index_dir=Path(replica), persist_every=random.Random(seed).choice([1, 7, 50])
    )
    return AsyncMemoryStore(url, embedder=HashingEmbedder(), settings=settings)


async def main(url: str, replicas: str, seed: int, mode: str, n: int) -> None:
    if mode == "write":
        st = _store(url, replicas, seed)
        await st.open()
        out({"ready": seed})
        await write(st, seed, n)
        await st.close()
        return
    acks = [json.loads(line) for line in sys.stdin]
    for i, replica in enumerate(replicas.split(",")):  # one server after the other
        st = _store(url, replica, seed + i)
        await st.open()
        await verify(st, acks)
        await st.close()


if __name__ == "__main__":
    a = sys.argv
    asyncio.run(main(a[1], a[2], int(a[3]), a[4], int(a[5]) if len(a) > 5 else 0))
