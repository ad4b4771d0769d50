"""Load shapes: a closed loop of N concurrent agents, or an open loop of Poisson arrivals.

Each simulated agent runs tasks from the scenario: it sends the conversation to the
target, acts on the model's real tool calls (simulated tools: latency from the scenario's
distribution, a result of the configured size appended to the conversation), waits its
think time, and goes on until the task's step budget is spent or the model answers
without a call.  Every random draw comes from a ``random.Random`` seeded by (seed, level,
agent), so two arms of the same level see the same tool latencies and the same tasks.

A level stops early when a step exceeds the saturation cap or the level runs out of time;
in-flight requests are then cancelled (the client disconnects, the server aborts them).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from loopstack.bench.load.metrics import StepRecord, TaskRecord, latency_growing
from loopstack.bench.load.scenario import Scenario, Task, ToolSimulator, tool_name
from loopstack.bench.load.target import StepResponse, Target

logger = logging.getLogger(__name__)
JSON = dict[str, Any]
Mode = Literal["closed", "open"]
RETRY_429 = 3


@dataclass
class LoadShape:
    mode: Mode = "closed"
    level: float = 1  # agents (closed) or tasks/s (open)
    tasks_per_agent: int = 1
    open_tasks: int = 8  # open loop: arrivals in total
    max_in_flight: int = 256  # open loop: arrivals beyond this are dropped
    warmup_s: float = 0.0
    max_duration_s: float = 600.0
    saturation_cap_s: float = 120.0
    seed: int = 0


@dataclass
class LevelRun:
    steps: list[StepRecord] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)
    wall_s: float = 0.0
    stop_reason: str | None = None
    saturated: bool = False
    dropped: int = 0


class SchemaState:
    """Cold/warm tool schemas.  A step is cold when it starts before the first use of its
    tool set (and ``tool_choice``) has finished - concurrent first users all wait for the
    same grammar compilation - or when it calls a tool whose schema no finished step had
    called before (servers compile each tool's argument grammar on its first use)."""

    def __init__(self) -> None:
        self.warm: set[str] = set()
        self.tools: set[str] = set()

    def is_cold(self, key: str) -> bool:
        return key not in self.warm

    def known_tools(self) -> set[str]:
        return set(self.tools)

    def mark_warm(self, key: str, tools: list[str]) -> None:
        self.warm.add(key)
        self.tools.update(tools)


class LevelRunner:
    """Runs one load level against one target and collects its records."""

    def __init__(
        self,
        target: Target,
        scenario: Scenario,
        shape: LoadShape,
        arm: str,
        nonce: str,
        schemas: SchemaState,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.target = target
        self.scenario = scenario
        self.shape = shape
        self.arm = arm
        self.nonce = nonce
        self.schemas = schemas
        self.on_step = on_step
        self.sim = ToolSimulator(scenario)
        self.run = LevelRun()
        self.stop = asyncio.Event()
        self.t0 = 0.0

    def _rng(self, *parts: object) -> random.Random:
        return random.Random("-".join(str(p) for p in (self.shape.seed, self.shape.level, *parts)))

    async def execute(self) -> LevelRun:
        self.t0 = time.perf_counter()
        if self.shape.mode == "closed":
            jobs = [self._agent(a) for a in range(int(self.shape.level))]
            main: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*jobs))
        else:
            main = asyncio.ensure_future(self._arrivals())
        stopper = asyncio.ensure_future(self.stop.wait())
        done, _ = await asyncio.wait(
            {main, stopper},
            timeout=self.shape.max_duration_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if main not in done:
            self.run.stop_reason = self.run.stop_reason or (
                f"time limit {self.shape.max_duration_s:.0f} s"
            )
            main.cancel()
            try:
                await main
            except asyncio.CancelledError:
                pass
        else:
            main.result()
        stopper.cancel()
        self.run.wall_s = time.perf_counter() - self.t0
        warm = [s.latency_s for s in sorted(self.run.steps, key=lambda s: s.end) if not s.cold]
        if self.run.stop_reason and "saturation" in self.run.stop_reason:
            self.run.saturated = True
        elif latency_growing(warm):
            self.run.saturated = True
            self.run.stop_reason = "step latency kept growing through the level"
        return self.run

    async def _agent(self, agent: int) -> None:
        rng = self._rng("agent", agent)
        tasks = self.scenario.tasks
        for k in range(self.shape.tasks_per_agent):
            if self.stop.is_set():
                return
            i = agent * self.shape.tasks_per_agent + k
            await self._task(agent, k, tasks[i % len(tasks)], rng)

    async def _arrivals(self) -> None:
        rng = self._rng("arrivals")
        running: set[asyncio.Task[None]] = set()
        tasks = self.scenario.tasks
        for i in range(self.shape.open_tasks):
            if self.stop.is_set():
                break
            if len(running) >= self.shape.max_in_flight:
                self.run.dropped += 1
            else:
                t = asyncio.ensure_future(
                    self._task(i, 0, tasks[i % len(tasks)], self._rng("task", i))
                )
                running.add(t)
                t.add_done_callback(running.discard)
            await asyncio.sleep(rng.expovariate(self.shape.level))
        try:
            if running:
                await asyncio.gather(*running)
        except asyncio.CancelledError:
            for t in running:
                t.cancel()
            raise

    def _choice(self, task: Task, step: int, tools: list[JSON]) -> Any:
        mode = self.scenario.tool_choice
        if mode != "named":
            return mode
        names = [tool_name(t) for t in tools]
        if task.plan:
            want = task.plan[step % len(task.plan)]
            pick = next(n for n in names if n.split("__", 1)[0] == want)
        else:
            pick = names[step % len(names)]
        return {"type": "function", "function": {"name": pick}}

    async def _task(self, agent: int, k: int, task: Task, rng: random.Random) -> None:
        sc = self.scenario
        tools = sc.tools_for(task, self.nonce)
        messages: list[JSON] = [{"role": "system", "content": sc.system_prompt}]
        if not sc.system_prompt:
            messages = []
        messages.append({"role": "user", "content": task.prompt})
        params: JSON = {"max_tokens": sc.max_tokens, "temperature": sc.temperature}
        if sc.extra_body:
            params["extra_body"] = dict(sc.extra_body)
        rec = TaskRecord(
            self.arm, self.shape.level, agent, k, task.name, self.now(), 0.0, 0, "done"
        )
        n_steps = task.steps + (1 if sc.final_answer else 0)
        try:
            for step in range(n_steps):
                if self.stop.is_set():
                    rec.outcome = "stopped"
                    break
                final = step == task.steps
                choice = "none" if final else self._choice(task, step, tools)
                key = f"{choice if isinstance(choice, str) else choice['function']['name']}:" + (
                    ",".join(tool_name(t) for t in tools)
                )
                resp, _ = await self._call(agent, k, step, messages, tools, choice, params, key)
                rec.model_calls += 1
                if not resp.ok:
                    rec.outcome = "error"
                    break
                if final:
                    break
                if not resp.tool_calls:
                    rec.outcome = "no_call"
                    break
                rec.tool_s += await self._act(resp, messages, rng)
                think = self.sim.think_time(rng)
                if think > 0:
                    rec.think_s += think
                    await asyncio.sleep(think)
        except asyncio.CancelledError:
            rec.outcome = "stopped"
            rec.end = self.now()
            self.run.tasks.append(rec)
            raise
        rec.end = self.now()
        self.run.tasks.append(rec)

    async def _call(
        self,
        agent: int,
        k: int,
        step: int,
        messages: list[JSON],
        tools: list[JSON],
        choice: Any,
        params: JSON,
        key: str,
    ) -> tuple[StepResponse, bool]:
        for attempt in range(RETRY_429 + 1):
            cold = self.schemas.is_cold(key) and choice != "none"
            known = self.schemas.known_tools()
            resp = await self.target.chat_step(messages, tools, choice, params)
            called = [c.name for c in resp.tool_calls]
            cold = cold or any(n not in known for n in called)
            start = resp.start - self.t0
            srec = StepRecord(
                arm=self.arm,
                level=self.shape.level,
                agent=agent,
                task=k,
                step=step,
                start=start,
                latency_s=resp.latency,
                ttft_s=resp.ttft,
                ok=resp.ok,
                status=resp.status,
                error=resp.error,
                prompt_tokens=resp.prompt_tokens,
                completion_tokens=resp.completion_tokens,
                cached_tokens=resp.cached_tokens,
                tool_calls=len(resp.tool_calls),
                cold=cold,
                warmup=start < self.shape.warmup_s,
                finish_reason=resp.finish_reason,
            )
            self.run.steps.append(srec)
            if resp.ok:
                self.schemas.mark_warm(key, called)
            if self.on_step:
                self.on_step(srec)
            if resp.latency > self.shape.saturation_cap_s and not cold:
                self.run.stop_reason = (
                    f"saturation: a step took {resp.latency:.1f} s "
                    f"> cap {self.shape.saturation_cap_s:.0f} s"
                )
                self.stop.set()
            if resp.status == 429 and attempt < RETRY_429:
                await asyncio.sleep(2.0)
                continue
            return resp, cold
        return resp, cold

    async def _act(self, resp: StepResponse, messages: list[JSON], rng: random.Random) -> float:
        """Append the call and the simulated results; returns the tool wall time."""
        messages.append(
            {
                "role": "assistant",
                "content": resp.content or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in resp.tool_calls
                ],
            }
        )
        delays = [self.sim.latency(rng, c.name) for c in resp.tool_calls]
        wall = max(delays, default=0.0)  # parallel calls run side by side
        if wall > 0:
            await asyncio.sleep(wall)
        for c in resp.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": c.id,
                    "content": self.sim.result(rng, c.name, c.arguments),
                }
            )
        return wall

    def now(self) -> float:
        return time.perf_counter() - self.t0
