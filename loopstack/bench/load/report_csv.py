"""CSV output of a load run: ``levels.csv`` (one row per arm and level, the columns below)
and ``steps.csv`` (one row per model call, every field of `StepRecord`)."""

from __future__ import annotations

import csv
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loopstack.bench.load.result import RunResult

LEVEL_COLUMNS = [
    ("arm", lambda s: s.arm),
    ("level", lambda s: s.level),
    ("mode", lambda s: s.mode),
    ("steps", lambda s: s.steps),
    ("warm_steps", lambda s: s.warm_steps),
    ("cold_steps", lambda s: s.cold_steps),
    ("tasks_done", lambda s: s.tasks_done),
    ("window_s", lambda s: s.window_s),
    ("step_p50_s", lambda s: s.step_latency.p50),
    ("step_p90_s", lambda s: s.step_latency.p90),
    ("step_p95_s", lambda s: s.step_latency.p95),
    ("step_p99_s", lambda s: s.step_latency.p99),
    ("ttft_p50_s", lambda s: s.ttft.p50),
    ("ttft_p95_s", lambda s: s.ttft.p95),
    ("cold_step_p50_s", lambda s: s.cold_step_latency.p50),
    ("cold_ttft_p50_s", lambda s: s.cold_ttft.p50),
    ("task_p50_s", lambda s: s.task_latency.p50),
    ("steps_per_s", lambda s: s.steps_per_s),
    ("tasks_per_min", lambda s: s.tasks_per_min),
    ("output_tok_s", lambda s: s.output_tok_s),
    ("model_calls_per_task", lambda s: s.model_calls_per_task),
    ("prompt_tokens_per_task", lambda s: s.prompt_tokens_per_task),
    ("completion_tokens_per_task", lambda s: s.completion_tokens_per_task),
    ("cached_tokens_per_task", lambda s: s.cached_tokens_per_task),
    ("errors", lambda s: s.errors),
    ("http_429", lambda s: s.http_429),
    ("goodput", lambda s: s.goodput),
    ("slo_s", lambda s: s.slo_s),
    ("prompt_tokens_mean", lambda s: s.prompt_tokens_mean),
    ("prefix_cache_hit_rate", lambda s: s.cache.hit_rate),
    ("engine_queue_s", lambda s: s.engine.get("queue_s")),
    ("engine_prefill_s", lambda s: s.engine.get("prefill_s")),
    ("engine_decode_s", lambda s: s.engine.get("decode_s")),
    ("engine_requests", lambda s: s.engine.get("requests")),
    ("client_cpu_s_per_step", lambda s: s.client_cpu_s_per_step),
    ("saturated", lambda s: s.saturated),
]


def write_csv(result: RunResult, out: Path) -> list[Path]:
    levels = out / "levels.csv"
    with levels.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([c for c, _ in LEVEL_COLUMNS])
        for lv in result.levels:
            w.writerow([_csv(get(lv.summary)) for _, get in LEVEL_COLUMNS])
    steps = out / "steps.csv"
    with steps.open("w", newline="") as fh:
        w = csv.writer(fh)
        rows = [asdict(s) for lv in result.levels for s in lv.steps]
        cols = list(rows[0]) if rows else ["arm"]
        w.writerow(cols)
        for r in rows:
            w.writerow([_csv(r[c]) for c in cols])
    return [levels, steps]


def _csv(v: Any) -> Any:
    return "" if v is None else v
