"""decide.py RUNS: RULE.md applied to run.sh's rows (items.jsonl, everyday.jsonl in RUNS)."""
import json
import sys
from collections import defaultdict
from pathlib import Path

runs = Path(sys.argv[1])
rows = [
    json.loads(line)
    for name in ("items.jsonl", "everyday.jsonl")
    for line in (runs / name).read_text().splitlines()
    if line.startswith("{") and '"item"' in line
]
need: dict = defaultdict(lambda: {"right": 0, "kept": 0, "n": 0, "items_right": 0, "items_kept": 0,
                                  "everyday_right": 0, "everyday_kept": 0})
false: dict = defaultdict(lambda: [0, 0])
for r in rows:
    if r["right"] is None:
        false[r["arm"]][0] += bool(r["called"])
        false[r["arm"]][1] += 1
        continue
    s, part = need[r["arm"]], "everyday" if r["item"].startswith("everyday") else "items"
    right, kept = bool(r["called"]) and r["called"][0] == r["right"], bool(r["called"])
    s["n"] += 1
    s["right"] += right
    s["kept"] += kept
    s[part + "_right"] += right
    s[part + "_kept"] += kept
off = need["given"]
print(f"{'arm':26} {'items r/k':>10} {'everyday r/k':>13} {'42: right':>10} {'kept':>5} {'false/40':>9}  passes")
table = []
for arm, s in need.items():
    f = false[arm]
    passes = arm != "given" and s["right"] >= off["right"] and s["kept"] >= off["kept"] and f[0] < false["given"][0]
    table.append((arm, s, f, passes))
    print(f"{arm:26} {s['items_right']:>4}/{s['items_kept']:<5} {s['everyday_right']:>6}/{s['everyday_kept']:<6} "
          f"{s['right']:>6}/{s['n']:<3} {s['kept']:>5} {f[0]:>5}/{f[1]:<3}  {'yes' if passes else 'no' if arm != 'given' else '-'}")
ok = [t for t in table if t[3]]
ok.sort(key=lambda t: (t[2][0], -t[1]["right"], -t[1]["kept"], t[0].count("+")))
print("ships:", ok[0][0] if ok else "off (nothing passes)")
