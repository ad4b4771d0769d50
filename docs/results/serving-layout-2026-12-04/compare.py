import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
key = lambda r: (r["id"], r["mode"], r["arm"])
ra = {key(r): r for r in a["records"]}; rb = {key(r): r for r in b["records"]}
fields = ("status", "name", "n_calls", "arguments", "valid")
same = diff = 0
for k in sorted(ra):
    x, y = ra[k], rb.get(k)
    if y is None:
        print("missing", k); diff += 1; continue
    if all(x.get(f) == y.get(f) for f in fields):
        same += 1
    else:
        diff += 1
        print("DIFF", k, {f: (x.get(f), y.get(f)) for f in fields if x.get(f) != y.get(f)})
print(f"same {same}, different {diff} of {len(ra)}")
for s in (a, b):
    print(json.dumps(s["summary"])[:600])
