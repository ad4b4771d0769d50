"""Child process for test_memory_crash.py: writes batches forever, printing each committed batch.

Not a test module (no ``test_`` prefix). Usage: ``python memory_crash_writer.py DB SEED``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings


async def main(db: str, seed: int) -> None:
    rng = random.Random(seed)
    settings = MemorySettings(persist_every=rng.choice([1, 7, 50, 10_000]))
    st = AsyncMemoryStore(db, embedder=HashingEmbedder(), settings=settings)
    await st.open()
    batch = 0
    while True:
        user = f"user{rng.randrange(3)}"
        texts = [f"batch {batch} item {i} token{rng.randrange(10**9)}" for i in range(32)]
        ids = await st.add_many(texts, user_id=user, check_conflicts=False)
        # Only now is the batch committed: report it.
        sys.stdout.write(json.dumps({"user": user, "ids": ids, "texts": texts}) + "\n")
        sys.stdout.flush()
        batch += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
