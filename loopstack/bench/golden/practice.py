"""A practice task set for bootstrapping worked examples (`loopstack.bench.golden.bootstrap`): the
same tools as the golden set, other questions. Never the golden tasks - examples bootstrapped from
them would teach the model the test.

    loopstack bench golden run --set practice --out /tmp/practice
    loopstack bench golden bootstrap /tmp/practice --out loopstack/bench/golden/examples.json
"""

from __future__ import annotations

from loopstack.bench.golden import checks as c
from loopstack.bench.golden import data as d
from loopstack.bench.golden.tasks import TIME_SERVER, Task


def practice_tasks() -> list[Task]:
    july = "2024-07"
    report = d.monthly_report(july)
    top = max(report["regions"], key=lambda r: r["revenue"])["region"]
    paris, oslo = d.WEATHER["paris"], d.WEATHER["oslo"]
    return [
        Task("p_weather_paris", "weather", "What is the weather in Paris today?",
             "tools_travel.py", c.all_of(c.answer_number(paris["temperature_c"]),
                                         c.answer_words(d.CONDITION_WORDS[paris["condition"]]))),
        Task("p_snow_oslo", "weather", "Is it snowing in Oslo today?", "tools_travel.py",
             c.answer_yes(oslo["condition"] == "snow")),
        Task("p_fx_rate", "exchange", "What is the exchange rate from GBP to USD?",
             "tools_travel.py", c.answer_number(d.rate("GBP", "USD"))),
        Task("p_fx_convert", "exchange", "Convert 80 EUR to GBP.", "tools_travel.py",
             c.answer_number(round(80 * d.rate("EUR", "GBP"), 2))),
        Task("p_calc_multiply", "calculator", "What is 36 * 24? Use the calculator.",
             "tools_calc.py", c.answer_number(36 * 24)),
        Task("p_calc_percent", "calculator", "What is 15% of 640?", "tools_calc.py",
             c.answer_number(640 * 0.15)),
        Task("p_sales_total", "sqlite", f"What was the total revenue in {july}?",
             "tools_sales.py", c.answer_number(report["total_revenue"])),
        Task("p_sales_top", "sqlite", f"Which region had the highest revenue in {july}?",
             "tools_sales.py", c.answer_names(top, d.REGIONS)),
        Task("p_files_items", "workspace", "How many items are listed in shopping.txt?",
             "tools_files.py", c.answer_number(len(d.WORKSPACE_FILES["shopping.txt"].split()))),
        Task("p_time_london", "mcp", "What time is it right now in London?", "tools_calc.py",
             c.all_of(c.called("get_current_time"), c.time_in_zone("Europe/London")),
             mcp=(TIME_SERVER,)),
    ]  # fmt: skip
