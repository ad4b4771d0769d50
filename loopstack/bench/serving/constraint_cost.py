"""What the grammar costs: decode tok/s and TTFT, constrained ÷ unconstrained.

Same prompts, same run, interleaved A/B: each prompt is sent once per arm, back to back,
with the arm order flipping from one prompt to the next (ABBA), so drift cancels.
Two kinds of prompts: corpus tool prompts with ``tool_choice="required"`` and
``response_format={"type": "json_schema", ...}`` prompts whose schema is a corpus tool's
parameters.  The unconstrained arm adds ``extra_body={"loopstack": {"constrained":
false}}`` (``--rf-unconstrained drop`` instead removes ``response_format``).

Every request is streamed: TTFT = first non-empty delta; decode rate = (completion
tokens - 1) / (end - first token); completion tokens come from ``usage``.

    loopstack bench serving constraint-cost --tool-prompts 20 --rf-prompts 8 --out cost.json
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import (
    CORPUS_PATH,
    DEFAULT_BASE_URL,
    JSON,
    UNCONSTRAINED_EXTRA,
    StreamResult,
    bootstrap_ratio,
    connect,
    finish,
    load_corpus,
    percentile,
    pick_spread,
    print_table,
    stream_chat,
    tool_index,
    tools_for,
)


def rf_prompt(entry: JSON) -> str:
    fn = entry["tool"]["function"]
    what = f" ({fn['description']})" if fn.get("description") else ""
    return (
        f"{entry['prompt']}\n\nDo not call anything: reply with only the JSON object of "
        f"arguments for `{fn['name']}`{what}."
    )


def build_requests(
    entries: list[JSON],
    index: dict[str, JSON],
    kind: str,
    model: str,
    max_tokens: int,
    rf_unconstrained: str = "flag",
) -> list[tuple[str, JSON, JSON]]:
    """(prompt id, constrained kwargs, unconstrained kwargs) per entry."""
    out = []
    for e in entries:
        fn = e["tool"]["function"]
        base: JSON = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
        if kind == "tool":
            con = base | {
                "messages": [{"role": "user", "content": e["prompt"]}],
                "tools": tools_for(e, index),
                "tool_choice": "required",
            }
            unc = con | {"extra_body": UNCONSTRAINED_EXTRA}
        elif kind == "rf":
            con = base | {
                "messages": [{"role": "user", "content": rf_prompt(e)}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": fn["name"], "schema": fn["parameters"]},
                },
            }
            if rf_unconstrained == "drop":
                unc = {k: v for k, v in con.items() if k != "response_format"}
            else:
                unc = con | {"extra_body": UNCONSTRAINED_EXTRA}
        else:
            raise ValueError(kind)
        out.append((f"{kind}:{e['id']}", con, unc))
    return out


def _nanmedian(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.median(xs) if xs else math.nan


def summarize_pairs(pairs: list[JSON]) -> JSON:
    """Ratios constrained/unconstrained over paired results (pure)."""
    ok = [p for p in pairs if p["constrained"]["ok"] and p["unconstrained"]["ok"]]
    out: JSON = {"pairs": len(pairs), "ok_pairs": len(ok)}
    for metric in ("decode_rate", "e2e_rate", "ttft", "completion_tokens"):
        con = [float(p["constrained"][metric]) for p in ok]
        unc = [float(p["unconstrained"][metric]) for p in ok]
        point, lo, hi = bootstrap_ratio(con, unc, "median")
        paired = [c / u for c, u in zip(con, unc, strict=True) if u and math.isfinite(c / u)]
        out[metric] = {
            "constrained_median": _nanmedian(con),
            "unconstrained_median": _nanmedian(unc),
            "constrained_min": min((x for x in con if math.isfinite(x)), default=math.nan),
            "unconstrained_min": min((x for x in unc if math.isfinite(x)), default=math.nan),
            "ratio_of_medians": point,
            "ratio_ci95": [lo, hi],
            "paired_ratio_median": _nanmedian(paired),
            "paired_ratio_p10": percentile(paired, 10),
            "paired_ratio_p90": percentile(paired, 90),
        }
    return out


def result_json(r: StreamResult) -> JSON:
    return {
        "ok": r.ok,
        "error": r.error,
        "ttft": r.ttft,
        "wall": r.wall,
        "decode_rate": r.decode_rate,
        "e2e_rate": r.e2e_rate,
        "completion_tokens": r.completion_tokens,
        "usage_reported": r.usage_reported,
        "finish_reason": r.finish_reason,
        "output": (r.tool_args or r.text)[:300],
    }


async def run(args: SimpleNamespace) -> int:
    corpus = load_corpus(Path(args.corpus))
    index = tool_index(corpus)
    if (connected := await connect(args.base_url, args.api_key, args.timeout, args.model)) is None:
        return 2
    client, model = connected
    picked = pick_spread(corpus, args.tool_prompts + args.rf_prompts)
    rf_entries = pick_spread(picked, args.rf_prompts) if args.rf_prompts else []
    tool_entries = [e for e in picked if e not in rf_entries]
    reqs = build_requests(tool_entries, index, "tool", model, args.max_tokens)
    reqs += build_requests(rf_entries, index, "rf", model, args.max_tokens, args.rf_unconstrained)

    if args.warmup:  # one of each arm, not recorded (first-request compile/caches)
        await stream_chat(client, **reqs[0][1])
        await stream_chat(client, **reqs[0][2])

    sem = asyncio.Semaphore(args.concurrency)
    transport = 0

    async def pair(i: int, pid: str, con: JSON, unc: JSON) -> JSON:
        nonlocal transport
        async with sem:
            if args.prime:  # unrecorded: compiles this schema's grammar, warms the prefix cache
                await stream_chat(client, **con)
            order = [("constrained", con), ("unconstrained", unc)]
            if i % 2:
                order.reverse()
            res: JSON = {"id": pid, "first": order[0][0]}
            for arm, kw in order:
                r = await stream_chat(client, **kw)
                transport += r.transport_error
                res[arm] = result_json(r)
            return res

    t0 = time.perf_counter()
    pairs = list(await asyncio.gather(*(pair(i, *r) for i, r in enumerate(reqs))))
    elapsed = time.perf_counter() - t0
    summary = {
        "all": summarize_pairs(pairs),
        "tool_required": summarize_pairs([p for p in pairs if p["id"].startswith("tool:")]),
        "response_format": summarize_pairs([p for p in pairs if p["id"].startswith("rf:")]),
    }
    print(f"model={model} base_url={args.base_url} pairs={len(pairs)} in {elapsed:.0f}s")
    rows = []
    for part, s in summary.items():
        if not s["ok_pairs"]:
            rows.append([part, 0, "-", "-", "-", "-", "-"])
            continue
        d, t = s["decode_rate"], s["ttft"]
        rows.append(
            [
                part,
                s["ok_pairs"],
                f"{d['constrained_median']:.2f} / {d['unconstrained_median']:.2f}",
                f"{d['ratio_of_medians']:.3f} [{d['ratio_ci95'][0]:.3f}, {d['ratio_ci95'][1]:.3f}]",
                f"{d['paired_ratio_median']:.3f}",
                f"{t['constrained_median'] * 1e3:.0f} / {t['unconstrained_median'] * 1e3:.0f}",
                f"{t['ratio_of_medians']:.3f}",
            ]
        )
    print_table(
        [
            "prompts",
            "pairs",
            "decode tok/s con/unc",
            "ratio (95% CI)",
            "paired",
            "TTFT ms con/unc",
            "TTFT ratio",
        ],
        rows,
    )
    errors = [
        p[a]["error"] for p in pairs for a in ("constrained", "unconstrained") if p[a]["error"]
    ]
    if errors:
        print(f"{len(errors)} failed requests, e.g. {errors[0]}")
    extra = {"model": model, "elapsed_s": round(elapsed, 1)}
    return finish(args, "constraint_cost", extra, {"summary": summary, "pairs": pairs}, transport)


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def options(
    base_url: str = typer.Option(DEFAULT_BASE_URL),
    api_key: str = typer.Option("EMPTY"),
    model: str | None = typer.Option(None, help="default: first model from /v1/models"),
    corpus: str = typer.Option(str(CORPUS_PATH)),
    tool_prompts: int = typer.Option(20),
    rf_prompts: int = typer.Option(8),
    rf_unconstrained: Literal["flag", "drop"] = typer.Option("flag"),
    max_tokens: int = typer.Option(96),
    concurrency: int = typer.Option(1, help="pairs in flight"),
    warmup: int = typer.Option(1, help="1: one unrecorded pair first"),
    prime: int = typer.Option(
        1,
        help="1: send each constrained request once, unrecorded, before its pair, so the "
        "figures are steady-state decoding, not first-use grammar compilation "
        "(measured separately by loopstack.bench.serving.constraint_compile)",
    ),
    timeout: float = typer.Option(600.0),
    out: str | None = typer.Option(None),
) -> int:
    return asyncio.run(run(SimpleNamespace(**locals())))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
