"""The server's ranking as it was before fb6ec81 (MiniLM for every request, examples of values
in the tool documents, a floor on every request), on the selection bench's items, reported as
`loopstack bench agent selection --rank-only` reports: run from the repository root,
`HF_HUB_OFFLINE=1 .venv/bin/python docs/results/selection-zh-2026-12-06/before-rank/rank_before.py en|zh`."""

import asyncio
import json
import subprocess
import sys
import types

from bench.agent.selection import abstention_items, arm_request, selection_items
from serving.embeddings import EmbeddingService
from serving.selection.requests import ServerEmbedder

OLD = subprocess.run(
    ["git", "show", "827b51e:serving/selection/rank.py"], capture_output=True, text=True, check=True
).stdout
old = types.ModuleType("old_rank")
sys.modules["old_rank"] = old
exec(OLD, old.__dict__)


async def main(lang: str) -> dict:
    ranker = old.ToolRanker(ServerEmbedder(EmbeddingService("all-MiniLM-L6-v2")))
    place: dict[int, list[int]] = {}
    right: list[float] = []
    for size in (5, 10, 30):
        for item in selection_items(60, size, 7, lang):
            tools, _ = arm_request(item, "given", 7, None)
            ranking = await ranker.rank(item.prompt, tools)
            names = [r.name for r in ranking]
            place.setdefault(size, []).append(names.index(item.right))
            right.append(next(r.score for r in ranking if r.name == item.right))
    best = [(await ranker.rank(i.prompt, list(i.tools)))[0].score for i in abstention_items(lang)]
    right.sort()
    time_tools = [t for t in json.load(open("bench/agent/time_tools.json"))]
    tokyo = {}
    for q in ("What time is it now in Tokyo?", "现在东京几点？"):
        tokyo[q] = [(r.name, round(r.score, 3)) for r in await ranker.rank(q, time_tools)]
    return {
        "right_tool_first": {str(k): f"{sum(p < 1 for p in v)}/{len(v)}" for k, v in place.items()},
        "right_tool_in_top": {
            str(k): {str(n): f"{sum(p < n for p in v)}/{len(v)}" for n in (3, 5)}
            for k, v in place.items()
        },
        "right_tool_score_quantiles": {
            str(q): round(right[int(q * (len(right) - 1))], 3) for q in (0.01, 0.02, 0.05, 0.5)
        },
        "floor": {
            str(f): {
                "right_kept": round(sum(x >= f for x in right) / len(right), 3),
                "abstention_left_without_tools": round(sum(b < f for b in best) / len(best), 3),
            }
            for f in (0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
        },
        "time_tools": tokyo,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1])), ensure_ascii=False))
