"""Child process for test_memory_crash.py's two-writer test: adds shared, repeated and
conflicting facts to one store forever, printing each committed add.

Not a test module (no ``test_`` prefix). Usage: ``python memory_dual_writer.py DB SEED``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings

PROJECTS = ["alpha", "bravo", "charlie"]
STATES = ["green", "amber", "red", "blocked", "shipped", "paused"]


def text_for(rng: random.Random) -> str:
    if rng.random() < 0.5:  # the same fact, added by both writers: one active record
        k = rng.randrange(12)
        return f"token{k}a token{k}b token{k}c token{k}d"
    # same subject, new value: each one supersedes the active one
    return f"Project {rng.choice(PROJECTS)} status is {rng.choice(STATES)}"


async def main(db: str, seed: int) -> None:
    rng = random.Random(seed)
    settings = MemorySettings(persist_every=rng.choice([1, 7, 50]))
    st = AsyncMemoryStore(db, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    while True:
        user = f"user{rng.randrange(2)}"
        text = text_for(rng)
        rid = await st.add(text, user_id=user)
        # Only now is it committed: report it.
        sys.stdout.write(json.dumps({"user": user, "id": rid, "text": text}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
