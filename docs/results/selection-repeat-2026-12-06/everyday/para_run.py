"""The everyday wordings (para.py) through the server, per arm; and the abstention set with
top 5 + the rule and no floor. Usage: para_run.py BASE_URL OUT"""
import argparse, asyncio, json, sys
sys.path.insert(0, '/work/main')
from loopstack.bench.agent.selection import Item, golden_tools, time_tools, abstention_items, arm_request, send_all, summarize, save
sys.path.insert(0, __import__('os').path.dirname(__file__))
from para import PARA

async def main(base, out):
    tools = {**golden_tools(), **time_tools()}
    offered = tuple(tools[n] for n in sorted(tools))
    items = [Item(f"everyday-{i:02d}", q, right, {}, offered) for i, (q, right) in enumerate(PARA)]
    nofloor = {"tool_rank": {"top_k": 5}, "abstain": True, "decide": False}
    jobs = []
    for it in items:
        for arm in ("defaults", "given", "given+abstain"):
            jobs.append((it, arm, *arm_request(it, arm, 7, None)))
        jobs.append((it, "top5-nofloor+abstain", list(it.tools), nofloor))
    for it in abstention_items("en"):
        jobs.append((it, "top5-nofloor+abstain", list(it.tools), nofloor))
    args = argparse.Namespace(base_url=base, api_key="test-key-123", model=None, concurrency=3, max_tokens=512, seed=7)
    rows = await send_all(args, jobs)
    s = summarize(rows)
    save(__import__("pathlib").Path(out), rows, s)
    print(json.dumps(s))
asyncio.run(main(sys.argv[1], sys.argv[2]))
