"""Recall quality on LoCoMo: hybrid vs vector-only vs keyword-only recall@k of evidence.

    HF_HUB_OFFLINE=1 .venv/bin/loopstack bench memory locomo

Data: LoCoMo (Maharana et al., ACL 2024, "Evaluating Very Long-Term Conversational Memory
of LLM Agents"), the 10-conversation release ``locomo10.zip`` from the authors' repository,
kept in ``loopstack/bench/memory/data/`` (CC BY-NC 4.0, see the README there). No PyPI package ships
the data itself (the harness packages on PyPI download it at run time).

Protocol:

* each conversation is one user; every dialogue turn becomes one record
  (``"Speaker: text"``, plus ``[shares a photo of ...]`` when the turn had an image), dated
  at its session's date; nothing is distilled or summarised;
* every question of categories 1-4 (multi-hop, temporal, open-domain, single-hop; category
  5, adversarial questions without an answer, is left out as usual) is a query for that
  user; its ``evidence`` turn ids are the relevant records;
* each mode runs the real pipeline (``AsyncMemoryStore.recall(mode=...)``, same embedder,
  same gate-3 scoring, ``now`` = the conversation's last session) with the threshold off,
  and ranks by final score;
* recall@k = share of a question's evidence turns in the top k, averaged over questions;
  hit@k = share of questions with at least one evidence turn in the top k.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import tempfile
import time
import zipfile
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from loopstack.bench.commandline import benchmark_app, run_command

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loopstack.memory import AsyncMemoryStore, MemorySettings
from loopstack.memory.embedding import MiniLMEmbedder
from loopstack.memory.store import RecallMode

# Not committed (CC BY-NC 4.0): see loopstack/bench/memory/data/README.md for how to obtain it.
DATA = Path(__file__).resolve().parent / "data" / "locomo10.zip"
MODES: tuple[RecallMode, ...] = ("hybrid", "vector", "keyword")
KS = (1, 3, 5, 10)


def load_conversations(path: Path = DATA) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(
            f"LoCoMo data not found at {path}: download locomo10.zip (or the json) from the "
            "authors' repository snap-research/locomo (data/), see "
            "loopstack/bench/memory/data/README.md"
        )
    with zipfile.ZipFile(path) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".json"))
        return [json.loads(zf.read(n)) | {"_name": Path(n).stem} for n in names]


def parse_when(s: str) -> float:
    return datetime.strptime(s.strip(), "%I:%M %p on %d %B, %Y").timestamp()


def turns_of(conv: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(dia_id, text, ts) for every turn of every session."""
    out = []
    sessions = sorted(
        (int(m.group(1)), k)
        for k in conv
        if (m := re.fullmatch(r"session_(\d+)", k)) and isinstance(conv[k], list)
    )
    for num, key in sessions:
        ts = parse_when(conv[f"session_{num}_date_time"])
        for i, turn in enumerate(conv[key]):
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares {turn['blip_caption']}]"
            out.append((turn["dia_id"], text, ts + i))
    return out


async def run(args: SimpleNamespace) -> dict[str, Any]:
    emb = MiniLMEmbedder()
    settings = MemorySettings(vector_k=args.depth, keyword_k=args.depth, persist_every=10**9)
    if args.pure:
        settings = settings.model_copy(
            update={"w_importance": 0.0, "w_freshness": 0.0, "type_boost": 0.0}
        )
    workdir = Path(tempfile.mkdtemp(prefix="locomo-"))
    st = AsyncMemoryStore(workdir / "locomo.db", embedder=emb, settings=settings)
    convs = load_conversations(args.data)[: args.limit]
    sums = {m: {f"recall@{k}": 0.0 for k in KS} | {f"hit@{k}": 0.0 for k in KS} for m in MODES}
    per_cat: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    n_q = n_turns = 0
    t_ingest = t_query = 0.0
    for conv in convs:
        user = f"locomo-{conv['_name']}"
        turns = turns_of(conv)
        t0 = time.perf_counter()
        ids = await st.add_many(
            [t for _, t, _ in turns],
            user_id=user,
            created_at=[ts for _, _, ts in turns],
            check_conflicts=False,
            source="user_explicit",
        )
        t_ingest += time.perf_counter() - t0
        n_turns += len(turns)
        by_dia = {dia: rid for (dia, _, _), rid in zip(turns, ids, strict=True)}
        now = max(ts for _, _, ts in turns)
        for qa in conv["qa"]:
            if qa["category"] == 5:
                continue
            gold = {by_dia[e] for e in qa.get("evidence", []) if e in by_dia}
            if not gold:
                continue
            n_q += 1
            for mode in MODES:
                t1 = time.perf_counter()
                rec = await st.recall(
                    qa["question"],
                    user_id=user,
                    mode=mode,
                    threshold=-math.inf,
                    budget_tokens=10**9,
                    max_items=max(KS),
                    now=now,
                )
                t_query += time.perf_counter() - t1
                ranked = [c.id for c in rec.candidates]
                for k in KS:
                    found = len(gold & set(ranked[:k]))
                    sums[mode][f"recall@{k}"] += found / len(gold)
                    sums[mode][f"hit@{k}"] += float(found > 0)
                cat = per_cat[mode].setdefault(str(qa["category"]), [])
                cat.append(len(gold & set(ranked[:5])) / len(gold))
    await st.close()
    table = {m: {k: round(v / n_q, 4) for k, v in sums[m].items()} for m in MODES}
    cats = {m: {c: round(sum(v) / len(v), 4) for c, v in sorted(per_cat[m].items())} for m in MODES}
    return {
        "conversations": len(convs),
        "turns": n_turns,
        "questions": n_q,
        "depth": args.depth,
        "pure_relevance": args.pure,
        "ingest_s": round(t_ingest, 1),
        "recall_s_all_modes": round(t_query, 1),
        "results": table,
        "recall@5_by_category": cats,
    }


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def locomo(
    data: Path = typer.Option(DATA, help="path to locomo10.zip"),
    limit: int = typer.Option(10, help="conversations to use (max 10)"),
    depth: int = typer.Option(24, help="vector_k and keyword_k"),
    pure: bool = typer.Option(
        False, "--pure", help="rank by relevance only (no importance/freshness)"
    ),
) -> None:
    args = SimpleNamespace(**locals())
    out = asyncio.run(run(args))
    print(f"{'mode':8s} " + " ".join(f"{k:>9s}" for k in out["results"]["hybrid"]))
    for mode, row in out["results"].items():
        print(f"{mode:8s} " + " ".join(f"{v:9.3f}" for v in row.values()))
    print("RESULT " + json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
