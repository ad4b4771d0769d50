"""Everyday wordings of the golden tools' requests (written before any score was seen):
what the ranker scores the right tool, against the shipped floor 0.3."""
import asyncio, sys
sys.path.insert(0, '/work/main')
from loopstack.bench.agent.selection import golden_tools, make_ranker, time_tools

PARA = [
    ("Is it raining in Oslo?", "get_weather"),
    ("Do I need an umbrella in Paris today?", "get_weather"),
    ("How cold is it in Berlin?", "get_weather"),
    ("Should I wear a jacket in London today?", "get_weather"),
    ("Is it sunny in Madrid right now?", "get_weather"),
    ("How many yen do I get for one euro?", "get_exchange_rate"),
    ("What's a dollar worth in pounds today?", "get_exchange_rate"),
    ("I have 300 dollars, how much is that in euros?", "convert_currency"),
    ("What's the time in Sydney?", "time__get_current_time"),
    ("Is it night in Tokyo now?", "time__get_current_time"),
    ("What's 15% of 320?", "calculate"),
    ("How much is 1234 times 5678?", "calculate"),
    ("How is ACME trading today?", "get_stock_price"),
    ("What's ACME's share price?", "get_stock_price"),
    ("Did anyone write to me?", "read_inbox"),
    ("Any new mail?", "read_inbox"),
    ("Tell bob@example.com by email that the meeting moved to 3pm.", "send_email"),
    ("What's in my workspace?", "list_files"),
    ("Show me my files.", "list_files"),
    ("What does notes/todo.txt say?", "read_file"),
    ("Create hello.txt containing hi there.", "write_file"),
    ("How did sales go in March 2025?", "monthly_sales_report"),
    ("How much did we sell in 2025-03?", "monthly_sales_report"),
    ("Which products sold best in the South in 2025-02?", "region_product_breakdown"),
]

async def main():
    tools = {**golden_tools(), **time_tools()}
    r = make_ranker()
    names = sorted(tools)
    offered = [tools[n] for n in names]
    kept = first = 0
    for q, right in PARA:
        res = await r.rank(q, offered)
        mine = next(x for x in res if x.name == right)
        place = [x.name for x in res].index(right) + 1
        kept += mine.score >= 0.3
        first += place == 1
        print(f"{mine.score:6.3f} dense {mine.dense:6.3f} kw {mine.keyword:4.2f} place {place:2d}  {'KEPT' if mine.score >= 0.3 else 'CUT '}  {q}  -> {right}; best {res[0].name} {res[0].score:.3f}")
    print(f"{len(offered)} tools offered; right tool first {first}/{len(PARA)}; kept by the 0.3 floor {kept}/{len(PARA)}")
asyncio.run(main())
