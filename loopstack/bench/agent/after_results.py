"""After a tool result: does the model answer from it? One tool round trip, sampled many times.

The turn a client sends after its first tool result - the user asked for the weather in
Paris, the model called ``get_weather``, the tool answered "N°C and foggy" (N drawn per sample:
3-38, never a multiple of 5) - sent to a running server ``--samples`` times per arm, all of an
arm at once. A sample passes when the reply is text that states N by the client bench's strict
checker (`loopstack.bench.clients.checks.states_number`: N as a number of its own, not negated, no
other Celsius figure); a repeated call, or text without N, fails. Arms (comma-separated):

* ``off`` / ``rule`` - ``loopstack.after_results`` false / true (the results rule said after the
  conversation, `loopstack.serving.selection.requests.RESULTS_RULE`; before 2026-12-08 in the system
  message); the request sets no sampling, so the engine's defaults apply (the model folder's
  generation_config.json);
* ``...@t1`` - the same with vLLM's own defaults sent explicitly (temperature 1, top-p 1, no
  top-k, no repetition penalty): the model as served before its publisher's sampling defaults
  were written into its folder.

    loopstack bench agent after-results --base-url URL --api-key KEY --samples 8

Prints one line per arm and ``RESULT {json}``."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, cast

import httpx
import typer

from loopstack.bench.clients.checks import states_number
from loopstack.bench.clients.runs import draw_value
from loopstack.bench.clients.sdk_tasks import QUESTION  # the client bench's own round trip
from loopstack.bench.commandline import benchmark_app, parse_command

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# vLLM's defaults when a model folder gives none (what `@t1` sends explicitly)
VLLM_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
ARMS = ("off", "rule", "off@t1", "rule@t1")


def round_trip(value: int) -> list[dict[str, Any]]:
    """The conversation after the first tool result: question, call, "N°C and foggy"."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"{value}°C and foggy"},
    ]


def body(arm: str, model: str, value: int) -> dict[str, Any]:
    rule, _, sampling = arm.partition("@")
    out: dict[str, Any] = {
        "model": model,
        "messages": round_trip(value),
        "tools": [TOOL],
        "loopstack": {"after_results": rule == "rule"},
    }
    if sampling == "t1":
        out.update(VLLM_DEFAULTS)
    return out


def judge(message: dict[str, Any], value: int) -> tuple[bool, str]:
    """Passed, and why: text stating the tool's value; a call or anything else fails."""
    if message.get("tool_calls"):
        return False, "called a tool again"
    verdict = states_number(message.get("content"), value)
    return verdict.done, verdict.why


async def sample(client: httpx.AsyncClient, arm: str, model: str, value: int) -> dict[str, Any]:
    resp = await client.post("/chat/completions", json=body(arm, model, value))
    if resp.status_code != 200:
        return {"arm": arm, "value": value, "ok": False, "why": f"HTTP {resp.status_code}"}
    message = resp.json()["choices"][0]["message"]
    ok, why = judge(message, value)
    return {"arm": arm, "value": value, "ok": ok, "why": why,
            "content": (message.get("content") or "")[:300],
            "selection": resp.headers.get("x-loopstack-selection")}  # fmt: skip


async def run(base_url: str, api_key: str, model: str | None, arms: list[str], samples: int,
              seed: int) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=900) as client:
        if model is None:
            model = (await client.get("/models")).json()["data"][0]["id"]
        results: dict[str, Any] = {"model": model, "samples": samples, "seed": seed, "arms": {}}
        for arm in arms:  # an arm's samples at once (the engine batches them), arm after arm
            values = [draw_value(rng) for _ in range(samples)]
            got = await asyncio.gather(*(sample(client, arm, model, v) for v in values))
            passed = sum(1 for g in got if g["ok"])
            calls = sum(1 for g in got if g["why"] == "called a tool again")
            print(f"{arm}: {passed}/{samples} answered from the result; {calls} called again")
            results["arms"][arm] = {"passed": passed, "called_again": calls, "samples": got}
    return results


app = benchmark_app(__doc__)


@app.command()
def options(
    base_url: str = typer.Option("http://127.0.0.1:8000/v1", "--base-url"),
    api_key: str = typer.Option("EMPTY", "--api-key"),
    model: str | None = typer.Option(None, "--model"),
    arms: str = typer.Option(",".join(ARMS), help="comma-separated: off, rule, off@t1, rule@t1"),
    samples: int = typer.Option(8, min=1, help="samples per arm"),
    seed: int = typer.Option(7),
) -> dict[str, Any]:
    chosen = arms.split(",")
    for arm in chosen:
        if arm not in ARMS:
            raise typer.BadParameter(f"unknown arm {arm!r}: {', '.join(ARMS)}")
    return {"base_url": base_url, "api_key": api_key, "model": model, "arms": chosen,
            "samples": samples, "seed": seed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    try:
        args = cast(dict[str, Any], parse_command(app, argv))
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    print("RESULT " + json.dumps(asyncio.run(run(**args)), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
