"""For each run folder: the zh service tasks, passed, and whether the answer (before the host's
"(From ...)" appendix) is mostly Chinese; en tasks passed."""
import json, re, sys
sys.path.insert(0, "/work/main")
from loopstack.memory.language import mostly_chinese
for f in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f + "/results.jsonl")]
    zh = [r for r in rows if r["id"].startswith("cs_") and r["id"].endswith("_zh")]
    en = [r for r in rows if r["id"].startswith("cs_") and r["id"].endswith("_en")]
    own = lambda a: re.split(r"\s*\(From ", a)[0]
    print(f"{f}: zh passed {sum(r['passed'] for r in zh)}/{len(zh)}, zh answers in Chinese "
          f"{sum(mostly_chinese(own(r['answer'])) for r in zh)}/{len(zh)}; en passed {sum(r['passed'] for r in en)}/{len(en)}")
