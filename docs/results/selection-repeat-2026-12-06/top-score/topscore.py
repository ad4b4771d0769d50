"""Top ranker score: requests that need a tool (right tool first?) vs requests no tool fits."""
import asyncio, sys
sys.path.insert(0, '/work/main')
from loopstack.bench.agent.selection import selection_items, abstention_items, make_ranker
from loopstack.bench.agent import bfcl
from loopstack.serving.selection.rank import floor_applies

async def main():
    r = make_ranker()
    need, none = [], []
    for it in selection_items(60, 10, 7, 'en'):
        res = await r.rank(it.prompt, list(it.tools))
        need.append(('sel', it.id, res[0].score, res[0].name == it.right, it.prompt[:50]))
    for it in abstention_items('en'):
        res = await r.rank(it.prompt, list(it.tools))
        none.append(('abst', it.id, res[0].score, res[0].name, it.prompt[:50]))
    data = bfcl.fetch()
    for name in ('multiple', 'live_multiple', 'irrelevance', 'live_irrelevance'):
        for it in bfcl.items(data, name, 40, 7):
            if not floor_applies(it.prompt):
                continue
            res = await r.rank(it.prompt, list(it.tools))
            row = (name, it.id, res[0].score, (res[0].name == it.right) if it.right else res[0].name, it.prompt[:50])
            (need if it.right else none).append(row)
    for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        def c(rows, kind): return sum(1 for x in rows if x[0].startswith(kind) and x[2] >= t), sum(1 for x in rows if x[0].startswith(kind))
        print(f"t={t}: need sel {c(need,'sel')}, bfcl multiple {c(need,'multiple')}, live {c(need,'live_multiple')}; none abst {c(none,'abst')}, irrelevance {c(none,'irrelevance')}, live_irr {c(none,'live_irrelevance')}")
    print("highest no-tool requests:")
    for x in sorted(none, key=lambda x: -x[2])[:15]: print('  ', round(x[2],3), x)
    print("lowest need requests:")
    for x in sorted(need, key=lambda x: x[2])[:10]: print('  ', round(x[2],3), x)
asyncio.run(main())
