import json, sys, collections
a = json.loads(open(sys.argv[1]).read()); b = json.loads(open(sys.argv[2]).read())
before = {p["pid"]: p for p in a["procs"]}
rows = collections.defaultdict(float)
for p in b["procs"]:
    d = p["cpu_s"] - before.get(p["pid"], {"cpu_s": 0})["cpu_s"]
    t = p["title"]
    kind = ("EngineCore" if "EngineCore" in t else "Worker" if "Worker" in t else
            "vllm api_server" if "api_server" in t else "loopstack serve" if "loopstack" in t else
            "launcher" if "launc" in t else t[:40])
    rows[(("arm" if p["root"] == b["procs"][0]["root"] else "baseline"), kind)] += d
print(f"window {b['t']-a['t']:.0f} s")
for k, v in sorted(rows.items()):
    print(f"{k[0]:9} {k[1]:18} {v:8.1f} CPU-s")
