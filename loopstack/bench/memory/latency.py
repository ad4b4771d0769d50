"""Recall latency (query embedding included) and write throughput of ``memory``.

    HF_HUB_OFFLINE=1 .venv/bin/loopstack bench memory latency --sizes 10000 100000 1000000

What it does, honestly:

* Texts are synthetic memory sentences from templates (people, projects, places, numbers),
  so FTS5 sees a realistic, skewed vocabulary. ``--real`` of them (default 10,000) are
  embedded with the real all-MiniLM-L6-v2; records beyond that reuse those real vectors
  with Gaussian noise added and re-normalised (building 1M real embeddings would take
  ~80 min on 2 cores). Texts of those records are still unique template sentences.
* All N records belong to ONE user, the worst case for a per-user shard (exact search up to
  ``hnsw_threshold``, HNSW beyond).
* Recall is the full pipeline ``AsyncMemoryStore.recall`` (embed query with MiniLM, FAISS,
  FTS5 with the ledger's scope token, ledger fetch, re-scoring, packing), timed end to end
  per query, sequentially, after warm-up.
* Write throughput: ``add_many`` of 64 texts with real embedding, ``add`` one at a time,
  and the ledger+index path with precomputed vectors (how the big stores are built).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import typer

from loopstack.bench.commandline import benchmark_app, run_command

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.embedding import MiniLMEmbedder, Vectors, normalize

PEOPLE = """Alice Bob Carol Dana Erik Farah Gita Hugo Ines Jonas Kenji Lena Mateo Nadia Omar
Priya Quinn Rosa Sami Tomas Uma Victor Wen Ximena Yusuf Zoe""".split()
RELATIONS = (
    "sister brother manager colleague mentor neighbour dentist landlord cousin friend".split()
)
PROJECTS = """Falcon Osprey Kestrel Heron Ibis Condor Merlin Raven Swift Wren Atlas Hermes
Apollo Orion Vega Lyra Nova Polaris Sirius Rigel""".split()
TOOLS = """Postgres Redis Kafka Terraform Ansible Kubernetes Docker Jenkins Grafana Prometheus
FastAPI Django React Svelte Rust Go Python TypeScript Helix Neovim Emacs VSCode pnpm
Poetry""".split()
PLACES = """Berlin Lisbon Porto Oslo Kyoto Austin Toronto Nairobi Lima Seoul Dublin Prague
Vienna Madrid Bergen Quito Hanoi Perth Cork Turin""".split()
FOODS = "oolong espresso ramen tapas sushi falafel pho pierogi curry tacos risotto".split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
HOBBIES = "bouldering chess cycling pottery sailing running birding baking".split()

TEMPLATES = [
    "User's {rel} {person} lives in {place}",
    "User prefers {tool} over {tool2} for project {project}",
    "Project {project} deploys every {day} at {hour}:00",
    "The {project} database runs on port {port}",
    "User is allergic to {food} and avoids it",
    "User moved to {place} in {year}",
    "{person} owns the {tool} migration for {project}",
    "User's favourite {food} place is near the {place} office",
    "The team decided to replace {tool2} with {tool} in {project}",
    "User practises {hobby} every {day} with {person}",
    "Invoice {num} for {project} is due on {day}",
    "User's {rel} {person} works on {project} in {place}",
    "Ticket {proj_code}-{num} blocks the {project} release",
    "User wants answers about {tool} kept short and with examples",
    "Meeting with {person} about {project} budget moved to {day}",
]
QUESTIONS = [
    "where does my {rel} live?",
    "which port does the {project} database use?",
    "what do I prefer for project {project}?",
    "when does {project} deploy?",
    "what food am I allergic to?",
    "who owns the {tool} migration?",
    "what did we decide about {tool2}?",
    "when do I do {hobby}?",
    "what blocks the {project} release?",
    "when is the {project} budget meeting?",
]


def fill(tpl: str, rng: random.Random) -> str:
    return tpl.format(
        rel=rng.choice(RELATIONS),
        person=rng.choice(PEOPLE),
        place=rng.choice(PLACES),
        tool=rng.choice(TOOLS),
        tool2=rng.choice(TOOLS),
        project=rng.choice(PROJECTS),
        day=rng.choice(DAYS),
        hour=rng.randrange(7, 19),
        port=rng.randrange(1024, 65535),
        food=rng.choice(FOODS),
        year=rng.randrange(2010, 2027),
        hobby=rng.choice(HOBBIES),
        num=rng.randrange(10_000, 99_999),
        proj_code=rng.choice(PROJECTS)[:3].upper(),
    )


def synth_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [fill(rng.choice(TEMPLATES), rng) for _ in range(n)]


def synth_vectors(base: Vectors, n: int, seed: int = 0, noise: float = 0.35) -> Vectors:
    """``n`` vectors: the real ``base`` ones, then noisy re-normalised copies of them."""
    rng = np.random.default_rng(seed)
    if n <= len(base):
        return base[:n]
    idx = rng.integers(0, len(base), size=n - len(base))
    extra = base[idx] + rng.normal(0, noise / np.sqrt(base.shape[1]), (len(idx), base.shape[1]))
    return np.vstack([base, normalize(extra.astype(np.float32))])


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def build(
    path: Path, texts: list[str], vecs: Vectors, emb: MiniLMEmbedder, s: MemorySettings
) -> tuple[AsyncMemoryStore, float]:
    st = AsyncMemoryStore(path, embedder=emb, settings=s)
    t0 = time.perf_counter()
    step = 10_000
    base_ts = time.time() - 400 * 86400
    for i in range(0, len(texts), step):
        chunk = texts[i : i + step]
        ts = [base_ts + (i + j) * 30.0 for j in range(len(chunk))]
        await st.add_many(
            chunk,
            user_id="bench-user",
            vectors=vecs[i : i + step],
            check_conflicts=False,
            created_at=ts,
            source="inferred",
        )
    await st.close()  # persist the index files
    st = AsyncMemoryStore(path, embedder=emb, settings=s)
    await st.open()  # reopen from disk, as a server would
    return st, time.perf_counter() - t0


async def measure_recall(st: AsyncMemoryStore, queries: list[str], warm: int) -> dict[str, Any]:
    for q in queries[:warm]:
        await st.recall(q, user_id="bench-user")
    lat: list[float] = []
    parts: dict[str, list[float]] = {}
    injected = 0
    for q in queries[warm:]:
        t0 = time.perf_counter()
        rec = await st.recall(q, user_id="bench-user")
        lat.append((time.perf_counter() - t0) * 1e3)
        injected += bool(rec.items)
        for k, v in rec.timings_ms.items():
            parts.setdefault(k, []).append(v)
    return {
        "queries": len(lat),
        "p50_ms": round(pct(lat, 50), 2),
        "p99_ms": round(pct(lat, 99), 2),
        "mean_ms": round(statistics.fmean(lat), 2),
        "parts_p50_ms": {k: round(pct(v, 50), 2) for k, v in parts.items()},
        "parts_p99_ms": {k: round(pct(v, 99), 2) for k, v in parts.items()},
        "with_items": injected,
    }


async def measure_writes(emb: MiniLMEmbedder, workdir: Path, texts: list[str]) -> dict[str, Any]:
    st = AsyncMemoryStore(workdir / "writes.db", embedder=emb)
    t0 = time.perf_counter()
    for i in range(0, 1024, 64):
        await st.add_many(texts[i : i + 64], user_id="w", check_conflicts=True)
    batch_rps = 1024 / (time.perf_counter() - t0)
    singles = []
    for t in texts[2000:2100]:
        t1 = time.perf_counter()
        await st.add(t, user_id="w2")
        singles.append((time.perf_counter() - t1) * 1e3)
    await st.close()
    return {
        "add_many_64_real_embedding_rps": round(batch_rps, 1),
        "add_single_p50_ms": round(pct(singles, 50), 2),
        "add_single_p99_ms": round(pct(singles, 99), 2),
    }


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def latency(
    sizes: list[int] = typer.Option([10_000, 100_000, 1_000_000]),
    real: int = typer.Option(10_000, help="texts embedded for real"),
    queries: int = typer.Option(400),
    warmup: int = typer.Option(30),
    hnsw_threshold: int = typer.Option(MemorySettings().hnsw_threshold),
    workdir: Path | None = typer.Option(None),
    skip_writes: bool = typer.Option(False, "--skip-writes"),
) -> None:
    asyncio.run(measure(SimpleNamespace(**locals())))


async def measure(args: SimpleNamespace) -> None:

    emb = MiniLMEmbedder()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="memory-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    texts = synth_texts(max(args.sizes), seed=1)
    t0 = time.perf_counter()
    base = emb.embed_sync(texts[: args.real])
    embed_s = time.perf_counter() - t0
    print(f"embedded {args.real} real texts in {embed_s:.1f}s ({args.real / embed_s:.0f}/s)")
    rng = random.Random(2)
    queries = [fill(rng.choice(QUESTIONS), rng) for _ in range(args.queries + args.warmup)]
    s = MemorySettings(persist_every=10**9, hnsw_threshold=args.hnsw_threshold)
    results: dict[str, Any] = {"real_embedded": args.real, "embed_rps": round(args.real / embed_s)}
    if not args.skip_writes:
        results["writes"] = await measure_writes(emb, workdir, texts)
        print("writes", json.dumps(results["writes"]))
    for n in sorted(args.sizes):
        vecs = synth_vectors(base, n, seed=n)
        path = workdir / f"store-{n}.db"
        st, build_s = await build(path, texts[:n], vecs, emb, s)
        stats = await st.stats()
        load_before = os.getloadavg()[0]
        r = await measure_recall(st, queries, args.warmup)
        r.update(
            loadavg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
            records=n,
            build_s=round(build_s, 1),
            build_rps=round(n / build_s),
            index="hnsw" if stats["hnsw_shards"] else "flat",
            db_mb=round(stats["bytes"] / 2**20),
        )
        results[str(n)] = r
        print(json.dumps({"size": n, **r}))
        await st.close()
        shutil.rmtree(path.with_name(path.name + ".index"), ignore_errors=True)
        for f in workdir.glob(f"store-{n}.db*"):
            f.unlink(missing_ok=True)
    print("RESULT " + json.dumps(results))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
