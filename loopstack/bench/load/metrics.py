"""Step and task records, level summaries and the server's prefix-cache counters.

Everything here is pure: the scheduler fills ``StepRecord``/``TaskRecord`` lists and
``summarize`` turns one level's records into a ``LevelSummary``.  Definitions:

- step latency: request sent -> last streamed byte of one model call;
- TTFT: request sent -> first non-empty content or tool-call delta;
- warm steps: after the warmup and not the first use of their tool set; cold steps: the
  first use of a tool set (schema) in the run, reported apart;
- throughput figures (steps/s, tasks/min, output tok/s) divide by the level's measured
  window (first counted step start -> last counted step end);
- goodput: share of warm steps that succeeded within the SLO (step latency <= slo_s);
- prefix-cache hit rate: delta hits / delta queries of vLLM's counters between the
  scrapes before and after the level.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from loopstack.bench.common import percentile


@dataclass
class StepRecord:
    arm: str
    level: float  # agents (closed loop) or arrival rate in tasks/s (open loop)
    agent: int
    task: int
    step: int
    start: float  # seconds since the level started
    latency_s: float
    ttft_s: float | None
    ok: bool
    status: int | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    tool_calls: int = 0
    cold: bool = False
    warmup: bool = False
    finish_reason: str | None = None

    @property
    def end(self) -> float:
        return self.start + self.latency_s


@dataclass
class TaskRecord:
    arm: str
    level: float
    agent: int
    task: int
    name: str
    start: float
    end: float
    model_calls: int
    outcome: str  # done | no_call | error | stopped
    tool_s: float = 0.0
    think_s: float = 0.0

    @property
    def latency_s(self) -> float:
        return self.end - self.start


@dataclass
class Dist:
    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


def dist(values: Sequence[float]) -> Dist:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return Dist()
    return Dist(
        n=len(vals),
        mean=sum(vals) / len(vals),
        p50=percentile(vals, 50),
        p90=percentile(vals, 90),
        p95=percentile(vals, 95),
        p99=percentile(vals, 99),
        max=max(vals),
    )


@dataclass
class CacheStats:
    queries: float | None = None
    hits: float | None = None

    @property
    def hit_rate(self) -> float | None:
        if self.queries is None or self.hits is None or self.queries <= 0:
            return None
        return self.hits / self.queries


@dataclass
class LevelSummary:
    arm: str
    level: float
    mode: str  # closed | open
    window_s: float
    steps: int
    warm_steps: int
    cold_steps: int
    tasks_done: int
    step_latency: Dist
    ttft: Dist
    cold_step_latency: Dist
    cold_ttft: Dist
    task_latency: Dist
    steps_per_s: float | None
    tasks_per_min: float | None
    output_tok_s: float | None
    model_calls_per_task: float | None
    errors: int
    http_429: int
    goodput: float | None
    slo_s: float | None
    prompt_tokens_mean: float | None
    cache: CacheStats = field(default_factory=CacheStats)
    client_cached_token_share: float | None = None
    engine: dict[str, float | None] = field(default_factory=dict)  # mean s per request
    client_cpu_s_per_step: float | None = None
    saturated: bool = False
    stop_reason: str | None = None
    # per finished task (the steps of tasks that ended done or no_call): what a task costs
    prompt_tokens_per_task: float | None = None
    completion_tokens_per_task: float | None = None
    cached_tokens_per_task: float | None = None  # None when the server gives no details
    tasks_per_s: float | None = None


def goodput(latencies: Sequence[float], oks: Sequence[bool], slo_s: float) -> float | None:
    """Share of steps that succeeded within ``slo_s`` (failed steps count as misses)."""
    if not latencies:
        return None
    good = sum(1 for lat, ok in zip(latencies, oks, strict=True) if ok and lat <= slo_s)
    return good / len(latencies)


def rate(count: float, window_s: float) -> float | None:
    return count / window_s if window_s > 0 else None


def summarize(
    arm: str,
    level: float,
    mode: str,
    steps: Sequence[StepRecord],
    tasks: Sequence[TaskRecord],
    slo_s: float | None,
    cache: CacheStats | None = None,
) -> LevelSummary:
    counted = [s for s in steps if not s.warmup]
    ok = [s for s in counted if s.ok]
    warm = [s for s in ok if not s.cold]
    cold = [s for s in ok if s.cold]
    if counted:
        window = max(s.end for s in counted) - min(s.start for s in counted)
    else:
        window = 0.0
    done = [t for t in tasks if t.outcome in ("done", "no_call")]
    warm_all = [s for s in counted if not s.cold]
    gp = (
        goodput([s.latency_s for s in warm_all], [s.ok for s in warm_all], slo_s) if slo_s else None
    )
    per_task = _per_task_tokens(ok, done)
    cached = [s for s in ok if s.cached_tokens is not None]
    share = (
        sum(s.cached_tokens or 0 for s in cached) / sum(s.prompt_tokens for s in cached)
        if cached and sum(s.prompt_tokens for s in cached)
        else None
    )
    return LevelSummary(
        arm=arm,
        level=level,
        mode=mode,
        window_s=window,
        steps=len(counted),
        warm_steps=len(warm),
        cold_steps=len(cold),
        tasks_done=len(done),
        step_latency=dist([s.latency_s for s in warm]),
        ttft=dist([s.ttft_s for s in warm if s.ttft_s is not None]),
        cold_step_latency=dist([s.latency_s for s in cold]),
        cold_ttft=dist([s.ttft_s for s in cold if s.ttft_s is not None]),
        task_latency=dist([t.latency_s for t in done]),
        steps_per_s=rate(len(ok), window),
        tasks_per_min=(60 * r if (r := rate(len(done), window)) is not None else None),
        output_tok_s=rate(sum(s.completion_tokens for s in ok), window),
        model_calls_per_task=(sum(t.model_calls for t in done) / len(done) if done else None),
        errors=len(counted) - len(ok),
        http_429=sum(1 for s in counted if s.status == 429),
        goodput=gp,
        slo_s=slo_s,
        prompt_tokens_mean=(sum(s.prompt_tokens for s in ok) / len(ok) if ok else None),
        cache=cache or CacheStats(),
        client_cached_token_share=share,
        prompt_tokens_per_task=per_task[0],
        completion_tokens_per_task=per_task[1],
        cached_tokens_per_task=per_task[2],
        tasks_per_s=rate(len(done), window),
    )


def _per_task_tokens(
    steps: Sequence[StepRecord], done: Sequence[TaskRecord]
) -> tuple[float | None, float | None, float | None]:
    """Mean prompt, completion and cached tokens of a finished task (all its model calls)."""
    keys = {(t.agent, t.task) for t in done}
    mine = [s for s in steps if (s.agent, s.task) in keys]
    if not done or not mine:
        return None, None, None
    n = len(done)
    cached = [s.cached_tokens for s in mine if s.cached_tokens is not None]
    return (
        sum(s.prompt_tokens for s in mine) / n,
        sum(s.completion_tokens for s in mine) / n,
        sum(cached) / n if cached else None,
    )


# ---------------------------------------------------------------------------
# saturation


def latency_growing(latencies: Sequence[float], factor: float = 2.0, min_n: int = 9) -> bool:
    """True when the last third of a level's step latencies (in completion order) has a
    median more than ``factor`` times the first third's: the queue keeps growing."""
    if len(latencies) < min_n:
        return False
    k = len(latencies) // 3
    first, last = percentile(latencies[:k], 50), percentile(latencies[-k:], 50)
    return first > 0 and last / first > factor


# ---------------------------------------------------------------------------
# Prometheus /metrics

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)")


def prom_counter(text: str, name: str) -> float | None:
    """Sum over label sets of a counter (``name`` or ``name_total``); None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m or m.group(1) not in (name, name + "_total"):
            continue
        try:
            total += float(m.group(3))
        except ValueError:
            continue
        seen = True
    return total if seen else None


PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"


def cache_delta(before: str | None, after: str | None) -> CacheStats:
    """Prefix-cache queries and hits (in tokens) between two scrapes."""
    if before is None or after is None:
        return CacheStats()
    vals = []
    for name in (PREFIX_QUERIES, PREFIX_HITS):
        a, b = prom_counter(before, name), prom_counter(after, name)
        vals.append(None if a is None or b is None else b - a)
    return CacheStats(queries=vals[0], hits=vals[1])


# vLLM's per-request histograms: mean seconds per request between two scrapes tell where a
# step's time went inside the engine (queue, prefill, decode).
ENGINE_HISTOGRAMS = {
    "queue_s": "vllm:request_queue_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "decode_s": "vllm:request_decode_time_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
    "ttft_s": "vllm:time_to_first_token_seconds",
}


def engine_delta(before: str | None, after: str | None) -> dict[str, float | None]:
    """Mean of each engine histogram over the requests finished between two scrapes, and
    the number of those requests (``requests``); engine-wide, so other clients count."""
    out: dict[str, float | None] = {}
    if before is None or after is None:
        return out
    for key, name in ENGINE_HISTOGRAMS.items():
        s0, s1 = prom_counter(before, name + "_sum"), prom_counter(after, name + "_sum")
        c0, c1 = prom_counter(before, name + "_count"), prom_counter(after, name + "_count")
        if None in (s0, s1, c0, c1) or not (c1 or 0) - (c0 or 0):
            out[key] = None
            continue
        out[key] = ((s1 or 0) - (s0 or 0)) / ((c1 or 0) - (c0 or 0))
        out["requests"] = (c1 or 0) - (c0 or 0)
    return out


_LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def prom_labels_value(text: str, name: str, label: str) -> float | None:
    """A numeric label of an info gauge (``vllm:cache_config_info{block_size="128"...}``)."""
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if not m or m.group(1) != name or not m.group(2):
            continue
        for key, value in _LABEL_RE.findall(m.group(2)):
            if key == label:
                try:
                    return float(value)
                except ValueError:
                    return None
    return None
