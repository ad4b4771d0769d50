"""Engine requests per tool-call turn, and what a new tool set costs on its first turn.

For each mode (``auto``, ``required``, named) an agent-like turn (system prompt, user
question, the corpus tools) is sent and vLLM's own counter, ``vllm:request_success_total``
(relayed on the server's /metrics), is read before and after: engine requests per turn.
Then cold vs warm: a tool set no cache has seen (corpus tools renamed with a fresh suffix)
is sent twice in a row, each with its own vLLM ``cache_salt`` so that neither step reuses
the other's prefix cache (otherwise the warm step skips the prompt's prefill and the gap is
mostly prefill, not compile); the first step minus the second is what compiling the new
tools costs (our admission + the engine's grammar compile). Spread: min / median / max.
Then, with ``--twins K``, the warm step against an unconstrained twin doing the same work:
the constrained ``required`` turn (its grammar compiled, its prompt in the prefix cache),
and the same request with the constraint off, ``ignore_eos`` and ``max_tokens`` set to the
tokens the constrained turn wrote: the same prompt, the same number of tokens decoded, no
grammar. ``--agents A`` runs A such sequences at once (a mixed batch); the order inside
each pair alternates. An agent's unconstrained arm is no floor for this model (without the
grammar its calls do not parse and its tasks end early); the twin is.

    loopstack bench serving turn-requests --base-url http://127.0.0.1:8000 --api-key KEY \\
        --turns 2 --cold 2 --tools 3 --twins 6 --agents 1
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import CORPUS_PATH, bootstrap_ratio

CORPUS = CORPUS_PATH
_COUNTER = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.eE+]+)$", re.M)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
QUESTION = "What's the weather in Paris for the next {n} days?"


def engine_requests(client: httpx.Client) -> float:
    return sum(float(v) for v in _COUNTER.findall(client.get("/metrics").text))


def settled(client: httpx.Client) -> float:
    last = engine_requests(client)
    for _ in range(10):
        time.sleep(0.3)
        now = engine_requests(client)
        if now == last:
            return now
        last = now
    return last


def turn(
    client: httpx.Client,
    model: str,
    tools: list[Any],
    choice: Any,
    n: int,
    salt: str = "",
    extra: dict[str, Any] | None = None,
) -> tuple[float, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Use tools when useful."},
            {"role": "user", "content": QUESTION.format(n=n)},
        ],
        "tools": tools,
        "tool_choice": choice,
        "max_tokens": 96,
        "temperature": 0,
    }
    if salt:
        body["cache_salt"] = salt
    body |= extra or {}
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    return time.perf_counter() - started, r.json()


def _tokens(resp: dict[str, Any]) -> Any:
    """Completion tokens of a reply: equal on both steps, or the gap is not the compile."""
    return (resp.get("usage") or {}).get("completion_tokens", "?")


def twin_steps(
    client: httpx.Client, model: str, tools: list[Any], pairs: int, agents: int
) -> dict[str, Any]:
    """Warm constrained steps and their unconstrained twins (same prompt, same token count),
    ``agents`` sequences at once; step seconds per arm and the paired ratios."""
    _, first = turn(client, model, tools, "required", 3)  # compiled, prompt cached
    n = _tokens(first)
    twin = {"loopstack": {"constrained": False}, "ignore_eos": True, "max_tokens": n}

    def agent(a: int) -> list[tuple[float, float, Any]]:
        out = []
        for i in range(pairs):
            got: dict[bool, tuple[float, dict[str, Any]]] = {}
            for constrained in (True, False) if (a + i) % 2 == 0 else (False, True):
                got[constrained] = turn(
                    client, model, tools, "required", 3, extra=None if constrained else twin
                )
            out.append((got[True][0], got[False][0], _tokens(got[True][1])))
        return out

    with ThreadPoolExecutor(agents) as pool:
        rows = [r for rs in pool.map(agent, range(agents)) for r in rs]
    con = [c for c, _, _ in rows]
    unc = [u for _, u, _ in rows]
    paired = sorted(c / u for c, u, _ in rows)
    ratio, lo, hi = bootstrap_ratio(con, unc)  # the pairs resampled, as constraint-cost does
    return {
        "agents": agents,
        "pairs": len(rows),
        "tokens": n,
        "same_tokens": sum(t == n for _, _, t in rows),
        "constrained_p50_s": statistics.median(con),
        "twin_p50_s": statistics.median(unc),
        "ratio_of_medians": ratio,
        "ratio_ci95": [lo, hi],
        "paired_min_median_max": [paired[0], statistics.median(paired), paired[-1]],
    }


def corpus_tools(n: int, suffix: str) -> list[Any]:
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()][:n]
    tools = []
    for e in entries:
        fn = dict(e["tool"]["function"])
        fn["name"] = (fn["name"] + suffix)[:64]
        tools.append({"type": "function", "function": fn})
    return tools


app = benchmark_app(__doc__)


@app.command()
def turn_requests(
    base_url: str = typer.Option("http://127.0.0.1:8000", help="no /v1"),
    api_key: str = typer.Option("EMPTY"),
    turns: int = typer.Option(2, help="turns per mode"),
    cold: int = typer.Option(2, help="cold/warm pairs"),
    tools: int = typer.Option(3, help="corpus tools beside get_weather"),
    twins: int = typer.Option(0, help="warm step vs twin: pairs per agent"),
    agents: str = typer.Option("1", help="twins: sequences at once, comma-separated"),
) -> None:
    return _command(SimpleNamespace(**locals()))


def _command(args: SimpleNamespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(base_url=args.base_url, headers=headers, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        tools = [WEATHER, *corpus_tools(args.tools, "")]
        named = {"type": "function", "function": {"name": "get_weather"}}
        turn(client, model, tools, "required", 3)  # compile these tools once
        for label, choice in (("auto", "auto"), ("required", "required"), ("named", named)):
            counts, calls = [], 0
            for i in range(args.turns):
                before = settled(client)
                _, resp = turn(client, model, tools, choice, 2 + i)
                counts.append(settled(client) - before)
                msg = (resp.get("choices") or [{}])[0].get("message") or {}
                calls += bool(msg.get("tool_calls"))
            if counts:
                print(f"{label:<9} engine requests per turn: {statistics.mean(counts):.2f} "
                      f"({counts}); turns with a call {calls}/{args.turns}")  # fmt: skip
        gaps = []
        for _ in range(args.cold):
            fresh = [WEATHER, *corpus_tools(args.tools, "_" + secrets.token_hex(3))]
            cold, c = turn(client, model, fresh, "required", 3, secrets.token_hex(8))
            warm, w = turn(client, model, fresh, "required", 3, secrets.token_hex(8))
            gaps.append(cold - warm)
            print(f"new tool set ({len(fresh)} tools): cold {cold:.2f} s, warm {warm:.2f} s "
                  f"(tokens out {_tokens(c)} / {_tokens(w)})")  # fmt: skip
        if gaps:
            print(f"cold minus warm (no prefix cache on either): median "
                  f"{statistics.median(gaps):.2f} s, min {min(gaps):.2f}, max {max(gaps):.2f} "
                  f"over {len(gaps)} sets")  # fmt: skip
        if args.twins:
            for agents in (int(a) for a in args.agents.split(",")):
                print(twin_line(twin_steps(client, model, tools, args.twins, agents)))


def twin_line(t: dict[str, Any]) -> str:
    lo, mid, hi = t["paired_min_median_max"]
    ci_lo, ci_hi = t["ratio_ci95"]
    return (
        f"warm step, {t['agents']} agent(s), {t['pairs']} pairs: constrained "
        f"{t['constrained_p50_s']:.2f} s, unconstrained twin {t['twin_p50_s']:.2f} s (p50; "
        f"{t['tokens']} tokens each, {t['same_tokens']}/{t['pairs']} the same): ratio "
        f"{t['ratio_of_medians']:.3f} (95 % CI {ci_lo:.3f}-{ci_hi:.3f}), paired {mid:.3f} "
        f"({lo:.3f}-{hi:.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
