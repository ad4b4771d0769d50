"""Soak: many streams, clients that vanish mid-stream, then overload - and everything the
server held is given back afterwards.

Phase 1 sends `--streams` concurrent streaming chat requests (a well-behaved client: on 429 it
waits Retry-After and tries again); `--disconnect` of them close the connection after their
first content chunk. Phase 2 sends a burst of `--burst` requests at once, without retries, to
go beyond the server's queue (LOOPSTACK_MAX_CONCURRENCY + LOOPSTACK_MAX_QUEUE): the excess must
get 429 with a Retry-After header. Then it waits until our admission gauges
(``loopstack_requests_running`` / ``_waiting``) and vLLM's ``vllm:num_requests_running`` /
``_waiting`` are back where they were before, and compares the server's RSS before and after.

    loopstack bench serving soak --base-url http://127.0.0.1:8100 --api-key KEY \\
        --streams 64 --disconnect 16 --burst 48

Loopback only; bounded in count (the arguments) and in time (`--timeout` per phase).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

import httpx
import typer

from loopstack.bench.commandline import benchmark_app, run_command

GAUGES = (
    "loopstack_requests_running",
    "loopstack_requests_waiting",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
PROMPT = "Count slowly from one to fifty, one number per line."
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


@dataclass
class Outcome:
    """One client request: how it ended."""

    phase: str
    status: int  # HTTP status of the last attempt (0: connection error)
    disconnected: bool = False  # the client walked away mid-stream on purpose
    retries: int = 0  # 429s answered by waiting Retry-After
    retry_after: bool = False  # the 429 (if any) carried Retry-After
    chunks: int = 0
    error: str = ""


@dataclass
class Report:
    outcomes: list[Outcome]
    samples: list[dict[str, float]]  # gauge readings taken during the run
    before: dict[str, float]
    after: dict[str, float]
    settle_s: float | None  # seconds until the gauges were back; None: they never were
    rss_before: int | None
    rss_after: int | None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_gauges(text: str) -> dict[str, float]:
    """Sum of each gauge in `GAUGES` over its label sets (vLLM labels by model / engine)."""
    out = dict.fromkeys(GAUGES, 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def summarize(report: Report) -> dict[str, Any]:
    """The figures: pure arithmetic over the outcomes and samples (unit-tested)."""
    by_phase: dict[str, Counter[str]] = {}
    for o in report.outcomes:
        c = by_phase.setdefault(o.phase, Counter())
        c["requests"] += 1
        if o.disconnected:
            c["disconnected"] += 1
        elif o.status == 200:
            c["completed"] += 1
        elif o.status == 429:
            c["429"] += 1
            c["429_with_retry_after"] += int(o.retry_after)
        elif o.status >= 500 or o.status == 0:
            c["server_errors"] += 1
        else:
            c["other_4xx"] += 1
        c["retries_after_429"] += o.retries
    peak = {g: max((s.get(g, 0.0) for s in report.samples), default=0.0) for g in GAUGES}
    back = {g: report.after.get(g, 0.0) <= report.before.get(g, 0.0) for g in GAUGES}
    rss_delta = (
        report.rss_after - report.rss_before
        if report.rss_after is not None and report.rss_before is not None
        else None
    )
    errors = [f"{o.phase}: {o.status} {o.error}" for o in report.outcomes if o.error][:5]
    return {
        "phases": {p: dict(c) for p, c in by_phase.items()},
        "errors": errors,
        "peak_held": int(peak["loopstack_requests_running"] + peak["loopstack_requests_waiting"]),
        "peak": peak,
        "before": report.before,
        "after": report.after,
        "back_to_baseline": all(back.values()),
        "settle_s": report.settle_s,
        "rss_before_mib": _mib(report.rss_before),
        "rss_after_mib": _mib(report.rss_after),
        "rss_delta_mib": _mib(rss_delta),
        **report.extra,
    }


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


# --------------------------------------------------------------------------- live parts
def server_pid(base_url: str, given: int | None) -> int | None:
    """The server's pid: given, or the process listening on the URL's port (psutil)."""
    if given is not None:
        return given
    try:
        import psutil
    except ImportError:
        return None
    port = urlparse(base_url).port or 80
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


async def gauges(client: httpx.AsyncClient) -> dict[str, float]:
    r = await client.get("/metrics", timeout=30)
    return parse_gauges(r.text)


async def one_stream(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    *,
    phase: str,
    disconnect: bool,
    retry: bool,
    deadline: float,
) -> Outcome:
    out = Outcome(phase=phase, status=0)
    while True:
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                out.status = r.status_code
                if r.status_code == 429:
                    out.retry_after = "retry-after" in r.headers
                    await r.aread()
                    if retry and time.monotonic() < deadline:
                        out.retries += 1
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                        continue
                    return out
                if r.status_code != 200:
                    out.error = (await r.aread()).decode(errors="replace")[:200]
                    return out
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        out.status, out.error = 500, str(event["error"])[:200]
                        return out
                    out.chunks += 1
                    if disconnect and out.chunks >= 2:
                        out.disconnected = True
                        return out  # leaving the block closes the connection mid-stream
                return out
        except httpx.HTTPError as exc:
            out.status, out.error = 0, repr(exc)[:200]
            return out


async def sampler(client: httpx.AsyncClient, into: list[dict[str, float]], stop: asyncio.Event):
    while not stop.is_set():
        try:
            into.append(await gauges(client))
        except httpx.HTTPError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


async def run(args: SimpleNamespace) -> Report:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # below uvicorn's default 5 s keep-alive (vLLM's; loopstack keeps 75 s): a pooled connection
    # the server is closing would fail the request without a response (a false server error)
    limits = httpx.Limits(max_connections=args.streams + args.burst + 8, keepalive_expiry=2.0)
    timeout = httpx.Timeout(args.timeout, connect=10)
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        pid = server_pid(args.base_url, args.server_pid)
        before = await gauges(client)
        rss_before = rss(pid)
        samples: list[dict[str, float]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(sampler(client, samples, stop))

        def body(max_tokens: int) -> dict[str, Any]:
            messages = [{"role": "user", "content": PROMPT}]
            return {"model": model, "messages": messages, "max_tokens": max_tokens,
                    "stream": True}  # fmt: skip

        deadline = time.monotonic() + args.timeout
        phase1 = [
            one_stream(
                client,
                body(args.max_tokens),
                phase="streams",
                disconnect=i % args.streams < args.disconnect,
                retry=True,
                deadline=deadline,
            )
            for i in range(args.streams)
        ]
        started = time.monotonic()
        outcomes = list(await asyncio.gather(*phase1))
        phase1_s = time.monotonic() - started
        deadline = time.monotonic() + args.timeout
        burst = [
            one_stream(
                client,
                body(args.burst_tokens),
                phase="burst",
                disconnect=False,
                retry=False,
                deadline=deadline,
            )
            for _ in range(args.burst)
        ]
        started = time.monotonic()
        outcomes += await asyncio.gather(*burst)
        burst_s = time.monotonic() - started
        stop.set()
        await watcher
        settle_start = time.monotonic()
        settle_s: float | None = None
        after = await gauges(client)
        while time.monotonic() - settle_start < args.settle_timeout:
            after = await gauges(client)
            if all(after[g] <= before[g] for g in GAUGES):
                settle_s = round(time.monotonic() - settle_start, 1)
                break
            await asyncio.sleep(0.5)
        return Report(
            outcomes=outcomes,
            samples=samples,
            before=before,
            after=after,
            settle_s=settle_s,
            rss_before=rss_before,
            rss_after=rss(pid),
            extra={
                "streams_s": round(phase1_s, 1),
                "burst_s": round(burst_s, 1),
                "server_pid": pid,
            },
        )


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def soak(
    base_url: str = typer.Option("http://127.0.0.1:8000"),
    api_key: str | None = typer.Option(None),
    model: str | None = typer.Option(None),
    streams: int = typer.Option(64),
    disconnect: int = typer.Option(16, help="streams that leave mid-way"),
    max_tokens: int = typer.Option(24),
    burst: int = typer.Option(48, help="requests at once, no retries"),
    burst_tokens: int = typer.Option(8),
    timeout: float = typer.Option(600, help="seconds per phase"),
    settle_timeout: float = typer.Option(60),
    server_pid: int | None = typer.Option(None),
) -> int:
    args = SimpleNamespace(**locals())
    host = urlparse(args.base_url).hostname
    if host not in {"127.0.0.1", "localhost", "::1"}:
        raise typer.BadParameter("the soak bench runs against a loopback server only")
    args.base_url = args.base_url.rstrip("/").removesuffix("/v1")
    figures = summarize(asyncio.run(run(args)))
    print(json.dumps(figures, indent=2))
    phases = figures["phases"]
    ok = (
        figures["back_to_baseline"]
        and all(c.get("server_errors", 0) == 0 for c in phases.values())
        and phases.get("burst", {}).get("429", 0)
        == phases.get("burst", {}).get("429_with_retry_after", 0)
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
