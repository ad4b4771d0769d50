"""What our layer costs: our endpoint vs raw vLLM on the same engine.

Our server runs vLLM's own OpenAI server on an internal port; this sends the same plain
chat requests (no tools, streaming, fixed ``max_tokens`` with ``ignore_eos`` so every
completion has the same length) to both, in rounds that alternate the target order
(ours first, then raw first, ...).  A round at concurrency C sends C requests at once to
one target and waits for all of them.  Reported per concurrency level and target:
aggregate completion tok/s (tokens of all rounds / summed round wall time), TTFT
p50/p90, and the ratios ours/raw.

    loopstack bench serving proxy-overhead --ours http://127.0.0.1:8000/v1 \\
        --raw http://127.0.0.1:8001/v1 --concurrency 1,8 --rounds 4
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import (
    JSON,
    StreamResult,
    error_text,
    finish,
    make_client,
    percentile,
    print_table,
    resolve_model,
    safe_div,
    stream_chat,
)

PROMPTS = [
    "Explain in a few sentences how a hash map handles collisions.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List some practical tips for keeping a small vegetable garden healthy.",
    "Describe the water cycle to a ten-year-old.",
    "What are the trade-offs between SQL and NoSQL databases?",
    "Summarise the plot of a heist movie you would like to see.",
    "Give step-by-step instructions for making a cup of pour-over coffee.",
    "Why do some programming languages use garbage collection and others do not?",
    "Write a polite email asking a colleague to review a pull request.",
    "Compare travelling by train and by plane for a 500 km trip.",
    "Describe what happens when you type a URL into a browser.",
    "Invent a board game and explain its rules briefly.",
]


def round_order(r: int, targets: list[str]) -> list[str]:
    """Alternate which target goes first, round by round."""
    return list(targets) if r % 2 == 0 else list(reversed(targets))


def summarize_rounds(rounds: list[JSON]) -> JSON:
    """Per concurrency and target: throughput and TTFT; ratios ours/raw (pure)."""
    out: JSON = {}
    for conc in sorted({r["concurrency"] for r in rounds}):
        level: JSON = {}
        for target in ("ours", "raw"):
            rs = [r for r in rounds if r["concurrency"] == conc and r["target"] == target]
            reqs = [q for r in rs for q in r["requests"]]
            ok = [q for q in reqs if q["ok"]]
            tokens = sum(q["completion_tokens"] for q in ok)
            wall = sum(r["wall"] for r in rs)
            ttfts = [q["ttft"] for q in ok if q["ttft"] == q["ttft"]]
            level[target] = {
                "rounds": len(rs),
                "requests": len(reqs),
                "failed": len(reqs) - len(ok),
                "completion_tokens": tokens,
                "tokens_per_request": sorted({q["completion_tokens"] for q in ok}),
                "wall_s": wall,
                "throughput_tok_s": safe_div(tokens, wall),
                "ttft_p50_s": percentile(ttfts, 50),
                "ttft_p90_s": percentile(ttfts, 90),
                "decode_tok_s_p50": percentile(
                    [q["decode_rate"] for q in ok if q["decode_rate"] == q["decode_rate"]], 50
                ),
            }
        ours, raw = level["ours"], level["raw"]
        level["ratio"] = {
            "throughput_ours_over_raw": safe_div(ours["throughput_tok_s"], raw["throughput_tok_s"]),
            "ttft_p50_ours_over_raw": safe_div(ours["ttft_p50_s"], raw["ttft_p50_s"]),
        }
        out[str(conc)] = level
    return out


def req_json(r: StreamResult) -> JSON:
    return {
        "ok": r.ok,
        "error": r.error,
        "transport_error": r.transport_error,
        "ttft": r.ttft,
        "wall": r.wall,
        "decode_rate": r.decode_rate,
        "completion_tokens": r.completion_tokens,
        "usage_reported": r.usage_reported,
    }


async def run(args: SimpleNamespace) -> int:
    clients = {
        "ours": make_client(args.ours, args.api_key, args.timeout),
        "raw": make_client(args.raw, args.raw_api_key or args.api_key, args.timeout),
    }
    models: dict[str, str] = {}
    for name, client in clients.items():
        try:
            models[name] = await resolve_model(
                client, args.model_ours if name == "ours" else args.model_raw
            )
        except Exception as exc:
            url = args.ours if name == "ours" else args.raw
            print(f"cannot reach {name} at {url}: {error_text(exc)}", file=sys.stderr)
            return 2
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    extra: JSON = {"ignore_eos": True} if args.ignore_eos else {}

    def kwargs(target: str, k: int) -> JSON:
        return {
            "model": models[target],
            "messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "extra_body": extra,
        }

    if args.warmup:
        for target in clients:
            await stream_chat(clients[target], **kwargs(target, 0))

    rounds: list[JSON] = []
    transport = 0
    t_start = time.perf_counter()
    for conc in levels:
        for r in range(args.rounds):
            for target in round_order(r, ["ours", "raw"]):
                t0 = time.perf_counter()
                results = await asyncio.gather(
                    *(
                        stream_chat(clients[target], **kwargs(target, r * conc + k))
                        for k in range(conc)
                    )
                )
                wall = time.perf_counter() - t0
                transport += sum(x.transport_error for x in results)
                rounds.append(
                    {
                        "concurrency": conc,
                        "round": r,
                        "target": target,
                        "wall": wall,
                        "requests": [req_json(x) for x in results],
                    }
                )
                toks = sum(x.completion_tokens for x in results)
                print(
                    f"  c={conc} round {r} {target}: {toks} tok in {wall:.1f}s",
                    file=sys.stderr,
                )
    elapsed = time.perf_counter() - t_start
    summary = summarize_rounds(rounds)
    print(f"ours={args.ours} ({models['ours']})  raw={args.raw} ({models['raw']})")
    rows = []
    for conc_key, level in summary.items():
        o, w, ratio = level["ours"], level["raw"], level["ratio"]
        rows.append(
            [
                conc_key,
                f"{o['throughput_tok_s']:.2f}",
                f"{w['throughput_tok_s']:.2f}",
                f"{ratio['throughput_ours_over_raw']:.3f}",
                f"{o['ttft_p50_s'] * 1e3:.0f}",
                f"{w['ttft_p50_s'] * 1e3:.0f}",
                f"{ratio['ttft_p50_ours_over_raw']:.3f}",
                f"{o['failed']}/{w['failed']}",
                f"{o['tokens_per_request']}/{w['tokens_per_request']}",
            ]
        )
    print_table(
        [
            "conc",
            "ours tok/s",
            "raw tok/s",
            "thr ratio",
            "ours TTFT ms",
            "raw TTFT ms",
            "TTFT ratio",
            "failed o/r",
            "tokens/req o/r",
        ],
        rows,
    )
    for level in summary.values():
        if level["ours"]["tokens_per_request"] != level["raw"]["tokens_per_request"]:
            print("warning: completion lengths differ between targets (ignore_eos not honoured?)")
            break
    extra = {"models": models, "elapsed_s": round(elapsed, 1)}
    payload = {"summary": summary, "rounds": rounds}
    return finish(args, "proxy_overhead", extra, payload, transport)


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def options(
    ours: str = typer.Option("http://127.0.0.1:8000/v1"),
    raw: str = typer.Option("http://127.0.0.1:8001/v1"),
    api_key: str = typer.Option("EMPTY"),
    raw_api_key: str | None = typer.Option(None, help="default: --api-key"),
    model_ours: str | None = typer.Option(None, help="default: first model from ours /v1/models"),
    model_raw: str | None = typer.Option(None, help="default: first model from raw /v1/models"),
    concurrency: str = typer.Option("1,8", help="comma-separated levels"),
    rounds: int = typer.Option(4, help="rounds per level and target"),
    max_tokens: int = typer.Option(64),
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--no-ignore-eos", help="--no-ignore-eos: do not send ignore_eos"
    ),
    warmup: int = typer.Option(1, help="1: one unrecorded request each"),
    timeout: float = typer.Option(600.0),
    out: str | None = typer.Option(None),
) -> int:
    return asyncio.run(run(SimpleNamespace(**locals())))


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
