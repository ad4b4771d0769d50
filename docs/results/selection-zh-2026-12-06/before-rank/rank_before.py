"""The server's ranking as it was before fb6ec81 (MiniLM for every request, examples of values
in the tool documents), reported by the bench's own `rank_report` (what `--rank-only` prints) on
the same items; the "floor_applies_to" figures are today's rule, not the old server's (which
applied a floor to every request). From the repository root:
`HF_HUB_OFFLINE=1 .venv/bin/python docs/results/selection-zh-2026-12-06/before-rank/rank_before.py en|zh`."""

import argparse
import asyncio
import json
import subprocess
import sys
import types

from loopstack.bench.agent.selection import rank_report
from loopstack.serving.embeddings import EmbeddingService
from loopstack.serving.selection.requests import ServerEmbedder

OLD = subprocess.run(
    ["git", "show", "827b51e:loopstack/serving/selection/rank.py"], capture_output=True, text=True, check=True
).stdout
old = types.ModuleType("old_rank")
sys.modules["old_rank"] = old
exec(OLD, old.__dict__)


async def main(lang: str) -> dict:
    ranker = old.ToolRanker(ServerEmbedder(EmbeddingService("all-MiniLM-L6-v2")))
    args = argparse.Namespace(sizes=[5, 10, 30], items=60, seed=7, lang=lang, everyday=None)
    report = await rank_report(ranker, args)
    tools = json.load(open("loopstack/bench/agent/time_tools.json"))
    report["time_tools"] = {
        q: [(r.name, round(r.score, 3)) for r in await ranker.rank(q, tools)]
        for q in ("What time is it now in Tokyo?", "现在东京几点？")
    }
    return report


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1])), ensure_ascii=False))
