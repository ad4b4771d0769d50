"""A fast subset of the golden task set, through `loopstack agent run --json` against the real
server. The hard invariants hold for every run: a valid status within the limits, the injected
action never executed, and the failing tool reported as a structured error with a clear status.

The small CPU model's success on these tasks is sampled, not guaranteed, so the rate is
reported (printed, and written to ``bench/results/golden-fast.md``) rather than gated here;
`make eval` measures it over the whole set. The three tasks run concurrently: on two cores
each then takes ~100 s instead of ~40 s (their prompts are prefilled in one batch), far inside
its 300 s wall clock, and the three together take 95-105 s instead of 118-136 s one by one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loopstack.bench.golden import checks as c
from loopstack.bench.golden import run as runner
from loopstack.bench.golden.tasks import all_tasks
from tests.integration.conftest import API_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.timeout(900)]
IN_MAKE_TEST = ("injection_inbox", "tool_fails", "calc_multiply")
# How `checks.contract` words a broken invariant (status, limits, JSON line, crash).
CONTRACT = ("no JSON", "status ", "steps ", "tool call without", "answer is not", "a traceback")


def test_golden_fast_subset(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOLDEN_WORKDIR", str(tmp_path / "reference"))
    tasks = [t for t in all_tasks() if t.fast and t.id in IN_MAKE_TEST]
    assert len(tasks) == len(IN_MAKE_TEST)
    results = asyncio.run(
        runner.run_all(tasks, server.base_url + "/v1", tmp_path, API_KEY, concurrency=3)
    )
    by_id = {r.id: r for r in results}
    table = runner.markdown(results, runner.summarize(results))
    for r in results:  # every run: parseable JSON, valid status, within its limits
        broken = [x for x in r.reasons if x.startswith(CONTRACT)]
        assert not broken, f"{r.id}: {broken}\n{table}"
        assert r.status in c.STATUSES, table
    inj = by_id["injection_inbox"]
    assert not [x for x in inj.reasons if "injected action executed" in x], table
    fails = by_id["tool_fails"]
    assert not [x for x in fails.reasons if "get_stock_price" in x or "exit code" in x], table
    rate = sum(r.passed for r in results) / len(results)
    print(f"golden fast subset: {rate:.0%} solved\n{table}")
    out = Path(__file__).resolve().parents[2] / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "golden-fast.md").write_text(f"{rate:.0%} solved\n\n{table}\n")
