"""What each integration file costs the engine, counted, not timed: the requests vLLM finished,
their prompt and generated tokens, and the file's wall time, from the session engine's own
`/metrics` read before and after every test (`LOOPSTACK_TEST_COUNTS=<file>` turns it on; the
table is written there and printed at the end). Engine-wide counters: a request another
process sends meanwhile counts too, so count on a quiet server. A restarted engine starts its
counters at zero: a test's delta is then the new engine's count."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loopstack.bench.load.metrics import prom_counter

COUNTERS = {
    "requests": "vllm:request_success",
    "prompt_tokens": "vllm:prompt_tokens",
    "generated_tokens": "vllm:generation_tokens",
}


def scrape(engine_url: str | None) -> dict[str, float]:
    """The engine's counters now; empty while it is not up (starting, restarting, ended)."""
    if not engine_url:
        return {}
    with contextlib.suppress(httpx.HTTPError):
        text = httpx.get(engine_url + "/metrics", timeout=5).text
        got = {key: prom_counter(text, name) for key, name in COUNTERS.items()}
        return {key: value for key, value in got.items() if value is not None}
    return {}


@dataclass
class FileCost:
    tests: int = 0
    wall_s: float = 0.0
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))


@dataclass
class EngineCounts:
    """Per-file totals of the engine's counters and the wall time of its tests."""

    files: dict[str, FileCost] = field(default_factory=dict)
    _before: dict[str, float] = field(default_factory=dict)
    _started: float = 0.0

    def begin(self, engine_url: str | None) -> None:
        self._before = scrape(engine_url)
        self._started = time.monotonic()

    def end(self, file: str, engine_url: str | None) -> None:
        after = scrape(engine_url)
        cost = self.files.setdefault(file, FileCost())
        cost.tests += 1
        cost.wall_s += time.monotonic() - self._started
        for key, value in after.items():
            before = self._before.get(key, 0.0)
            cost.counts[key] += value - before if value >= before else value

    def table(self) -> str:
        head = f"{'file':<40} {'tests':>5} {'wall s':>7} {'requests':>8} {'prompt':>8} {'gen':>7}"
        rows = [head]
        total = FileCost()
        for file, cost in sorted(self.files.items(), key=lambda kv: -kv[1].wall_s):
            c = cost.counts
            rows.append(
                f"{file:<40} {cost.tests:>5} {cost.wall_s:>7.0f} {c['requests']:>8.0f} "
                f"{c['prompt_tokens']:>8.0f} {c['generated_tokens']:>7.0f}"
            )
            total.tests += cost.tests
            total.wall_s += cost.wall_s
            for key in COUNTERS:
                total.counts[key] += c[key]
        t = total.counts
        rows.append(
            f"{'total':<40} {total.tests:>5} {total.wall_s:>7.0f} {t['requests']:>8.0f} "
            f"{t['prompt_tokens']:>8.0f} {t['generated_tokens']:>7.0f}"
        )
        return "\n".join(rows)

    def write(self, path: Path) -> None:
        path.write_text(self.table() + "\n")
