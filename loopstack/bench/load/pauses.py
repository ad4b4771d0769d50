"""Prefix-cache hit rate against tool pauses: does an agent's context survive the time its
tool takes? (`loopstack bench pauses`)

For each pause (a fixed tool latency) the agents sweep runs again with every tool taking
that long; each level reports vLLM's prefix-cache hit rate (hits / queries, in tokens,
between scrapes), the step latency and TTFT. If the hit rate falls as pauses grow, the
engine evicted the paused agents' blocks; the table says at which pause and load. The
KV-cache size the server reports (``vllm:cache_config_info`` kv_cache_size_tokens)
bounds the working set: agents x context tokens beyond it must evict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loopstack.bench.common import fmt_num as _x
from loopstack.bench.load.metrics import prom_labels_value
from loopstack.bench.load.runner import SweepConfig, run_sweep
from loopstack.bench.load.scenario import Scenario, with_tool_latency
from loopstack.bench.load.target import OpenAITarget, TargetConfig


@dataclass
class PauseRow:
    pause_s: float
    agents: int
    steps: int
    hit_rate: float | None
    client_cached_share: float | None
    step_p50_s: float | None
    step_p95_s: float | None
    ttft_p50_s: float | None
    steps_per_s: float | None
    prompt_tokens_mean: float | None


async def kv_cache_tokens(target: TargetConfig, http_client: Any = None) -> int | None:
    """KV-cache capacity in tokens, from vLLM's ``cache_config_info`` gauge if exposed."""
    t = await OpenAITarget(target, http_client).open()
    try:
        text = await t.scrape_metrics()
    finally:
        await t.close()
    if not text:
        return None
    tokens = prom_labels_value(text, "vllm:cache_config_info", "kv_cache_size_tokens")
    if tokens:
        return int(tokens)
    blocks = prom_labels_value(text, "vllm:cache_config_info", "num_gpu_blocks")
    size = prom_labels_value(text, "vllm:cache_config_info", "block_size")
    return int(blocks * size) if blocks and size else None


async def run_pauses(
    target: TargetConfig,
    scenario: Scenario,
    pauses: list[float],
    agents: list[int],
    tasks_per_agent: int = 1,
    max_level_s: float = 600.0,
    http_factory: Callable[[], Any] | None = None,
) -> list[PauseRow]:
    """``http_factory`` makes each sweep's http client (tests: a mock transport)."""
    rows: list[PauseRow] = []
    for pause in pauses:
        sc = with_tool_latency(scenario, f"fixed:{pause}")
        cfg = SweepConfig(
            levels=[float(a) for a in agents],
            tasks_per_agent=tasks_per_agent,
            max_level_s=max_level_s,
            saturation_cap_s=max_level_s,
        )
        http = http_factory() if http_factory else None
        res = await run_sweep([target], sc, cfg, http_client=http)
        for s in res.summaries(target.name):
            rows.append(
                PauseRow(
                    pause_s=pause,
                    agents=int(s.level),
                    steps=s.steps,
                    hit_rate=s.cache.hit_rate,
                    client_cached_share=s.client_cached_token_share,
                    step_p50_s=s.step_latency.p50,
                    step_p95_s=s.step_latency.p95,
                    ttft_p50_s=s.ttft.p50,
                    steps_per_s=s.steps_per_s,
                    prompt_tokens_mean=s.prompt_tokens_mean,
                )
            )
    return rows


def save_rows(rows: list[PauseRow], kv_tokens: int | None, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"kv_cache_tokens": kv_tokens, "rows": [asdict(r) for r in rows]}, indent=1)
    )


def table(rows: list[PauseRow]) -> tuple[list[str], list[list[str]]]:
    head = ["pause s", "agents", "steps", "hit rate (vLLM)", "cached share (client)",
            "step p50 s", "step p95 s", "TTFT p50 s", "steps/s", "prompt tok"]  # fmt: skip
    body = [
        [f"{r.pause_s:g}", str(r.agents), str(r.steps), _x(r.hit_rate), _x(r.client_cached_share),
         _x(r.step_p50_s), _x(r.step_p95_s), _x(r.ttft_p50_s), _x(r.steps_per_s, 3),
         _x(r.prompt_tokens_mean, 0)]
        for r in rows
    ]  # fmt: skip
    return head, body
