"""One vLLM GPU replica simulated one scheduler iteration at a time: the queueing that the
steady-state model (`loopstack.bench.load.replica`) only approximates.

The steady-state model prices a mean iteration and adds a queueing wait of an assumed form.
A benchmark's TTFT is mostly that wait: ``vllm bench serve --max-concurrency C`` starts its
C clients at the same instant, so C prompts queue for the token budget at once, and under
Poisson arrivals (MLPerf's Server) a burst queues behind the running batch. Here nothing is
assumed about the wait; it follows from vLLM V1's scheduler and the iteration's cost:

- each iteration the running requests go first: a decoding one takes one token, one part-way
  through its prompt its next chunk; then waiting requests are admitted first come first
  served while the token budget (``max_num_batched_tokens``), ``max_num_seqs`` and the KV
  cache (a request's prompt + output tokens, reserved on admission) have room; a prompt
  larger than the budget's remainder is chunked (chunked prefill, on by default in V1)
- the iteration lasts ``step(Batch)``: the roofline's cost (`loopstack.bench.load.roofline.step_s`)
  or
  any other step function (BLIS's), of exactly the batch it runs
- a request's first token is sampled by the iteration that computes its prompt's last chunk;
  each later iteration gives it one more token
- a request reaches the engine ``overhead(prompt)`` after it is sent (API, tokenising); its
  TTFT and end-to-end count from the send; TPOT = (e2e - TTFT) / (output - 1)

Drivers: ``closed`` (C clients, each sending its next request the instant its last one ends,
``num_prompts`` in all: ``vllm bench serve --request-rate inf --max-concurrency C``),
``poisson`` (open arrivals at a rate, seeded), ``offline`` (every request at t = 0). Pure:
the same inputs give the same figures.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from loopstack.bench.common import percentile
from loopstack.bench.load import BenchError
from loopstack.bench.load.replica import OverheadFn, StepFn
from loopstack.bench.load.roofline import Batch


@dataclass
class _Req:
    send: float
    arrive: float
    prompt: int
    output: int
    done: int = 0  # prompt tokens computed
    generated: int = 0
    first: float = math.nan
    end: float = math.nan


@dataclass(frozen=True)
class SimStats:
    ttft: list[float]
    tpot: list[float]
    e2e: list[float]
    makespan_s: float
    iterations: int
    outputs: list[float]

    @property
    def throughput_rps(self) -> float:
        return len(self.e2e) / self.makespan_s if self.makespan_s > 0 else 0.0

    def mean(self, which: str) -> float:
        return statistics.fmean(getattr(self, which))

    def median(self, which: str) -> float:
        return statistics.median(getattr(self, which))

    def p(self, which: str, q: float) -> float:
        """Percentile ``q`` in [0, 100]."""
        return percentile(getattr(self, which), q)


@dataclass(frozen=True)
class Engine:
    """What the simulator needs of a replica."""

    step: StepFn
    overhead: OverheadFn
    budget: int
    max_seqs: int
    kv_tokens: float = math.inf  # KV cache capacity in tokens


def _plan(
    e: Engine, running: list[_Req], waiting: deque[_Req], kv_used: float
) -> tuple[list[tuple[_Req, int]], float]:
    """This iteration's (request, tokens) pairs (1 = a decode) and the KV now reserved."""
    room, work = e.budget, []
    for r in running:  # running first: decodes and the next chunk of a part-prefilled prompt
        if room <= 0:
            break
        n = 1 if r.done >= r.prompt else min(r.prompt - r.done, room)
        work.append((r, n))
        room -= n
    while waiting and room > 0 and len(running) < e.max_seqs:
        r = waiting[0]
        need = r.prompt + r.output
        if kv_used + need > e.kv_tokens and running:
            break  # no room in the KV cache: it waits for a request to end
        waiting.popleft()
        kv_used += need
        running.append(r)
        n = min(r.prompt, room)
        work.append((r, n))
        room -= n
    return work, kv_used


def _batch(work: list[tuple[_Req, int]]) -> Batch:
    dec_s = dec_ctx = pre_t = pre_ctx = pre_s = pre_read = 0.0
    for r, n in work:
        if r.done >= r.prompt:  # a decode: attends to the prompt and what it generated
            dec_s += 1
            dec_ctx += r.prompt + r.generated
        else:  # a prefill chunk: its tokens attend to the chunks before and half of itself
            pre_t += n
            pre_ctx += n * (r.done + n / 2)
            pre_s += 1 if r.done + n >= r.prompt else 0  # the chunk that samples a token
            pre_read += r.done
    return Batch(dec_s, dec_ctx, pre_t, pre_ctx, pre_s, pre_read)


def simulate(
    e: Engine,
    prompt: int,
    output: int,
    *,
    mode: str,
    n: int,
    concurrency: int = 1,
    rate: float = 0.0,
    seed: int = 0,
    outputs: Sequence[int] | None = None,
) -> SimStats:
    """Run ``n`` requests of ``prompt`` -> ``output`` tokens through the engine (``mode``:
    closed | poisson | offline; see the module docstring); ``outputs``: each request's own
    output length instead (the i-th request sent gets ``outputs[i % len(outputs)]``)."""
    if prompt < 1 or output < 1 or n < 1 or (outputs is not None and min(outputs, default=0) < 1):
        raise BenchError("a simulated request needs a prompt, an output and a count >= 1")
    lengths = list(outputs) if outputs else [output]
    if mode == "poisson" and rate <= 0:
        raise BenchError("poisson arrivals need a rate > 0")
    over = e.overhead(prompt)
    arrivals: list[tuple[float, int, _Req]] = []
    sent = 0

    def send(at: float) -> None:
        nonlocal sent
        out = lengths[sent % len(lengths)]
        heapq.heappush(arrivals, (at + over, sent, _Req(at, at + over, prompt, out)))
        sent += 1

    if mode == "closed":
        for _ in range(min(concurrency, n)):
            send(0.0)
    elif mode == "poisson":
        rng, at = random.Random(seed), 0.0
        for _ in range(n):
            at += rng.expovariate(rate)
            send(at)
    elif mode == "offline":
        for _ in range(n):
            send(0.0)
    else:
        raise BenchError(f"unknown simulation mode {mode!r}: closed | poisson | offline")

    now, kv_used, iters = 0.0, 0.0, 0
    running: list[_Req] = []
    waiting: deque[_Req] = deque()
    done: list[_Req] = []
    while len(done) < n:
        while arrivals and arrivals[0][0] <= now:
            waiting.append(heapq.heappop(arrivals)[2])
        if not running and not waiting:
            now = arrivals[0][0]  # idle: the next arrival
            continue
        work, kv_used = _plan(e, running, waiting, kv_used)
        if not work:
            raise BenchError("the engine cannot run a single request (KV cache too small)")
        now += e.step(_batch(work))
        iters += 1
        for r, k in work:
            if r.done < r.prompt:
                r.done += k
                if r.done >= r.prompt:
                    r.generated, r.first = 1, now
            else:
                r.generated += 1
            if r.done >= r.prompt and r.generated >= r.output:
                r.end = now
                running.remove(r)
                kv_used -= r.prompt + r.output
                done.append(r)
                if mode == "closed" and sent < n:
                    send(now)
    ttft = [r.first - r.send for r in done]
    e2e = [r.end - r.send for r in done]
    tpot = [(r.end - r.first) / (r.output - 1) for r in done if r.output > 1]
    outs = [float(r.output) for r in done]
    return SimStats(ttft, tpot or [0.0], e2e, now, iters, outs)


def max_entropy_lengths(mean: float, cap: int, n: int, seed: int = 0) -> list[int]:
    """``n`` lengths in [1, cap] with the given mean and nothing else assumed: the maximum
    entropy distribution, p(k) proportional to exp(lam x k), lam solving the mean (lam = 0,
    uniform, at mean (cap + 1) / 2). For a benchmark that states a cap and, through its
    throughput, a mean, but not the spread."""
    if not 1 <= mean <= cap:
        raise BenchError(f"a mean output of {mean} does not lie in [1, {cap}]")
    ks = range(1, cap + 1)

    def mean_at(lam: float) -> float:
        top = max(lam * k for k in ks)
        w = [math.exp(lam * k - top) for k in ks]
        return sum(k * x for k, x in zip(ks, w, strict=True)) / sum(w)

    lo, hi = -50.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_at(mid) < mean else (lo, mid)
    top = max(lo * k for k in ks)
    weights = [math.exp(lo * k - top) for k in ks]
    return random.Random(seed).choices(list(ks), weights, k=n)
