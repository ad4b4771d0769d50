"""The workload the GPU plan (`loopstack.bench.load.gpuplan`) sizes replicas for, in a file or from
flags: closed-loop agents, or open-loop requests, so published runs can be described too.

Agents (``kind: agents``): each task is ``steps`` model calls; every call's prompt is the
whole conversation so far, so the context grows by the answer and the tool result each
step; between calls the agent pauses for its tool (and ``think``); ``shared_prefix_tokens``
(system prompt, tool schemas) are the same for every agent.

    context at step j = shared_prefix + first_prompt + j x (output + tool_result)

Requests (``kind: requests``): Poisson arrivals at ``rate`` per second; each is a session of
``turns`` turns (1: single requests) separated by ``think`` seconds, every turn's prompt the
session so far plus ``input_tokens`` new ones (the first turn: ``shared_prefix_tokens`` +
``input_tokens``).

    kind: agents                      kind: requests
    steps: 6                          rate: 10
    shared_prefix_tokens: 2000        input_tokens: 1024
    first_prompt_tokens: 300          output_tokens: 128
    output_tokens: 150                turns: 1
    output_tokens_p95: 400            think: fixed:5
    tool_result_tokens: 400
    tool_pause: lognormal:2,0.8
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopstack.bench.load import BenchError
from loopstack.bench.load.scenario import Sampler, parse_distribution


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shared_prefix_tokens: int = Field(0, ge=0)
    output_tokens: float = Field(gt=0, description="mean output tokens a call")
    output_tokens_p95: float | None = Field(None, gt=0)

    def out_p95(self) -> float:
        return self.output_tokens_p95 or self.output_tokens


class AgentWorkload(_Base):
    """Closed-loop agents."""

    kind: Literal["agents"] = "agents"
    agents: int | None = Field(None, ge=1, description="N (the CLI's --agents wins)")
    steps: int = Field(6, ge=1)
    first_prompt_tokens: int = Field(300, ge=1)
    tool_result_tokens: int = Field(400, ge=0)
    tool_pause: str = "lognormal:2,0.8"
    think: str | None = None

    def context(self, step: int) -> float:
        grow = self.output_tokens + self.tool_result_tokens
        return self.shared_prefix_tokens + self.first_prompt_tokens + step * grow

    def mean_context(self) -> float:
        return sum(self.context(j) for j in range(self.steps)) / self.steps

    def pause(self) -> PauseDist:
        return PauseDist.of(self.tool_pause, self.think)

    def describe(self) -> str:
        return (
            f"closed-loop agents: {self.steps} calls a task, context {self.context(0):.0f} -> "
            f"{self.context(self.steps - 1):.0f} tokens ({self.shared_prefix_tokens} shared), "
            f"{self.output_tokens:g} output tokens a call (p95 {self.out_p95():g}), "
            f"{self.tool_result_tokens} tokens a tool result, tool pause {self.tool_pause}"
            + (f", think {self.think}" if self.think else "")
        )


class RequestWorkload(_Base):
    """Open-loop requests (or multi-turn sessions)."""

    kind: Literal["requests"] = "requests"
    rate: float | None = Field(None, gt=0, description="arrivals (sessions) per second")
    input_tokens: float = Field(gt=0)
    turns: int = Field(1, ge=1)
    think: str | None = None

    def context(self, turn: int) -> float:
        return (
            self.shared_prefix_tokens + (turn + 1) * self.input_tokens + turn * self.output_tokens
        )

    def describe(self) -> str:
        sess = f"sessions of {self.turns} turns, think {self.think}, " if self.turns > 1 else ""
        return (
            f"open-loop requests: {sess}{self.input_tokens:g} input and {self.output_tokens:g} "
            f"output tokens a request, {self.shared_prefix_tokens} shared"
        )


Workload = Annotated[AgentWorkload | RequestWorkload, Field(discriminator="kind")]


class _File(BaseModel):
    workload: Workload


class PauseDist:
    """Tool + think time between a call's answer and the agent's next call: its mean and
    ``P(pause < tau)``, estimated from a fixed seeded sample (the scenario's samplers)."""

    def __init__(self, samples: list[float], words: str) -> None:
        self.samples = sorted(samples)
        self.words = words

    @classmethod
    def of(cls, tool: str, think: str | None = None, n: int = 4000) -> PauseDist:
        rng = random.Random(7)
        tool_s: Sampler = parse_distribution(tool).sampler()
        think_s: Sampler | None = parse_distribution(think).sampler() if think else None
        xs = [
            tool_s.sample(rng) + (think_s.sample(rng) if think_s is not None else 0.0)
            for _ in range(n)
        ]
        return cls(xs, tool + (f" + think {think}" if think else ""))

    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)

    def below(self, tau: float) -> float:
        """Share of pauses shorter than ``tau``."""
        import bisect

        return bisect.bisect_left(self.samples, tau) / len(self.samples)


def load_workload(path: Path) -> AgentWorkload | RequestWorkload:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BenchError(f"cannot read workload {path}: {exc}") from exc
    try:
        return _File.model_validate({"workload": raw}).workload
    except ValidationError as exc:
        raise BenchError(f"bad workload {path}: {exc}") from exc
