"""Re-read the recorded first calls of a run folder with loopstack.bench.agent.bfcl's argument check as
it is now (rows that kept their arguments only): per arm, right calls as recorded and now.

    .venv/bin/python docs/results/bfcl-2026-12-06/recheck.py docs/results/bfcl-2026-12-06/q05-args
"""

import json
import sys
from collections import Counter
from pathlib import Path

from loopstack.bench.agent import bfcl

run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
summary = json.loads((run / "summary.json").read_text())
source = summary["source"]
data = bfcl.fetch()
items = {i.id: i for name in source["sets"] for i in bfcl.items(data, name, source["n"], source["seed"])}
before, after = Counter(), Counter()
for r in rows:
    item = items[r["item"]]
    if item.right is None or not r["correct"]:
        continue
    before[r["arm"]] += bool(r["args_ok"])
    after[r["arm"]] += bool(item.check(json.loads(r["arguments"] or "{}")))
for arm in sorted(before.keys() | after.keys()):
    print(f"{arm}: right calls as recorded {before[arm]}, rechecked {after[arm]}")
