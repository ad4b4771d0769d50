"""CPU seconds of a process tree, by process title: python cpu.py PID... -> JSON line."""
import json, sys, time
import psutil
out = {"t": time.time(), "procs": []}
for pid in map(int, sys.argv[1:]):
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        continue
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            title = " ".join(p.cmdline())[:80]
            out["procs"].append({"root": pid, "pid": p.pid, "name": p.name(), "title": title,
                                 "cpu_s": round(t.user + t.system, 2),
                                 "children_cpu_s": round(t.children_user + t.children_system, 2)})
        except psutil.Error:
            pass
print(json.dumps(out))
