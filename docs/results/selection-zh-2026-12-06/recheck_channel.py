"""The service checker's channel reading before and after the clause fix (2026-12-06) on every
recorded answer to a cs_preference task under docs/results: which verdicts change. From the
repository root: `.venv/bin/python docs/results/selection-zh-2026-12-06/recheck_channel.py`."""

import glob
import json
import re

import loopstack.bench.golden.tasks_service as service
from loopstack.bench.golden import reading

BEFORE = re.compile(r"(?:\bnot?\b|\bnever\b|\bwithout\b|\bno\b|\brather than\b|\binstead of\b|"
                    r"不|别|勿|无需|避免|而非)[^.。!！?？;；]{0,24}$", re.I)  # fmt: skip


def before(text: str, at: int) -> bool:
    return BEFORE.search(text[max(0, at - 40) : at]) is None


def passes(offered, text: str, lang: str) -> bool:
    want, refused = service.CHANNEL_WORDS[lang]
    ok = any(offered(text, at) for w in want for at in reading.mentions(text, w))
    return ok and not any(offered(text, at) for w in refused for at in reading.mentions(text, w))


n = changed = 0
for path in sorted(glob.glob("docs/results/**/results.jsonl", recursive=True)):
    for line in open(path):
        r = json.loads(line)
        if str(r.get("id", "")).startswith("cs_preference"):
            lang, answer = ("zh" if r["id"].endswith("_zh") else "en"), r.get("answer") or ""
            n += 1
            a, b = passes(before, answer, lang), passes(service._offered, answer, lang)
            if a != b:
                changed += 1
                print(path, r["id"], a, "->", b, repr(answer[:200]))
print(f"answers {n}, verdicts changed {changed}")
