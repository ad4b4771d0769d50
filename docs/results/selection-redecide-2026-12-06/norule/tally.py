"""tally.py RUNS: per arm, right / kept on the 18 items, the 24 everyday, the 24 held-out
wordings and all 66, and false calls of 40."""
import json
import sys
from collections import defaultdict
from pathlib import Path

runs = Path(sys.argv[1])
t: dict = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
for name in ("items", "everyday", "heldout"):
    for line in (runs / f"{name}.jsonl").read_text().splitlines():
        if not (line.startswith("{") and '"item"' in line):
            continue
        r = json.loads(line)
        part = "false/40" if r["right"] is None else name
        c = t[r["arm"]][part]
        called = bool(r["called"])
        c[0] += called and (r["right"] is None or r["called"][0] == r["right"])
        c[1] += called
        c[2] += 1
print(f"{'arm':18} {'items r/k':>10} {'everyday':>10} {'held out':>10} {'all 66':>10} {'false':>7}")
for arm, parts in t.items():
    tot = [sum(parts[p][i] for p in ("items", "everyday", "heldout")) for i in range(3)]
    cell = lambda p: f"{parts[p][0]}/{parts[p][1]}"
    print(f"{arm:18} {cell('items'):>10} {cell('everyday'):>10} {cell('heldout'):>10} "
          f"{tot[0]}/{tot[1]:<6} {parts['false/40'][1]:>3}/{parts['false/40'][2]}")
