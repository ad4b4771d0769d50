"""Scope isolation with the real embedder: randomised queries, zero cross-user results.

    HF_HUB_OFFLINE=1 .venv/bin/loopstack bench memory isolation --users 100 --queries 10000

Users get records drawn from ONE pool of template sentences (``loopstack.bench.memory.latency``), so
every user's store looks like everyone else's and a leak would surface at once. Queries
are random record texts of any user, or template questions, asked as a random user with
the threshold off and a huge budget, so every candidate of gate 2 is checked, not only the
injected ones. Exits non-zero on the first foreign record.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import typer

from loopstack.bench.commandline import benchmark_app, run_command

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.bench.memory.latency import QUESTIONS, fill, synth_texts
from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.embedding import MiniLMEmbedder


async def run(users: int, per_user: int, queries: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    emb = MiniLMEmbedder()
    st = AsyncMemoryStore(
        Path(tempfile.mkdtemp(prefix="iso-")) / "iso.db",
        embedder=emb,
        settings=MemorySettings(persist_every=10**9),
    )
    pool = synth_texts(users * per_user, seed=seed)
    owner: dict[str, str] = {}
    t0 = time.perf_counter()
    for u in range(users):
        texts = pool[u * per_user : (u + 1) * per_user]
        for rid in await st.add_many(texts, user_id=f"user{u}", check_conflicts=False):
            owner[rid] = f"user{u}"
    ingest_s = time.perf_counter() - t0
    checked = nonempty = 0
    t1 = time.perf_counter()
    for i in range(queries):
        me = f"user{rng.randrange(users)}"
        q = rng.choice(pool) if rng.random() < 0.6 else fill(rng.choice(QUESTIONS), rng)
        rec = await st.recall(q, user_id=me, threshold=-math.inf, budget_tokens=10**6)
        for c in rec.candidates:
            if owner[c.id] != me:
                print(f"LEAK at query {i}: {me} got {owner[c.id]}'s {c.id}", file=sys.stderr)
                sys.exit(1)
        checked += len(rec.candidates)
        nonempty += bool(rec.candidates)
    await st.close()
    return {
        "users": users,
        "records": users * per_user,
        "queries": queries,
        "candidates_checked": checked,
        "queries_with_candidates": nonempty,
        "cross_user_results": 0,
        "ingest_s": round(ingest_s, 1),
        "query_s": round(time.perf_counter() - t1, 1),
    }


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def isolation(
    users: int = typer.Option(100),
    per_user: int = typer.Option(50),
    queries: int = typer.Option(10_000),
    seed: int = typer.Option(11),
) -> None:
    print("RESULT " + json.dumps(asyncio.run(run(users, per_user, queries, seed))))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
