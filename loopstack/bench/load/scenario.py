"""The scenario file: tasks of several steps, tool schemas, simulated tool latency.

A scenario (YAML or JSON) says what each simulated agent does: the tools it offers the
model, its tasks (a prompt and a number of model calls), how long each tool takes
(a distribution, or replayed from traces recorded by ``agent/``), how big each tool
result is (results are appended to the conversation, so the context grows every step)
and the think time between steps.  ``load_scenario`` validates it with pydantic; the
samplers are plain classes, seeded by the caller's ``random.Random``.
"""

from __future__ import annotations

import glob
import json
import math
import random
import secrets
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loopstack.bench.load import ScenarioError

DEFAULT_SCENARIO = Path(__file__).resolve().parent / "default_scenario.yaml"
ToolChoiceMode = Literal["none", "auto", "required", "named"]

# ---------------------------------------------------------------------------
# latency distributions (seconds)


class Fixed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["fixed"] = "fixed"
    value: float = Field(0.0, ge=0)

    def sampler(self) -> Sampler:
        return FixedSampler(self.value)


class Uniform(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["uniform"] = "uniform"
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError("uniform: high < low")
        return self

    def sampler(self) -> Sampler:
        return UniformSampler(self.low, self.high)


class LogNormal(BaseModel):
    """Log-normal with the given median (e^mu) and shape sigma; optional cap."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(0.5, ge=0)
    max: float | None = Field(None, gt=0)

    def sampler(self) -> Sampler:
        return LogNormalSampler(self.median, self.sigma, self.max)


class Replay(BaseModel):
    """Tool latencies drawn from recorded agent traces (JSONL, one file per run)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["replay"] = "replay"
    traces: list[str] = Field(min_length=1, description="files or glob patterns")

    def sampler(self) -> Sampler:
        return ReplaySampler.from_files(self.traces)


Distribution = Annotated[Fixed | Uniform | LogNormal | Replay, Field(discriminator="kind")]


class Sampler:
    """Draws one latency in seconds; ``tool`` lets replay pick per tool name."""

    def sample(self, rng: random.Random, tool: str = "") -> float:
        raise NotImplementedError

    def mean(self) -> float:
        raise NotImplementedError


@dataclass
class FixedSampler(Sampler):
    value: float

    def sample(self, rng: random.Random, tool: str = "") -> float:
        return self.value

    def mean(self) -> float:
        return self.value


@dataclass
class UniformSampler(Sampler):
    low: float
    high: float

    def sample(self, rng: random.Random, tool: str = "") -> float:
        return rng.uniform(self.low, self.high)

    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass
class LogNormalSampler(Sampler):
    median: float
    sigma: float
    cap: float | None = None

    def sample(self, rng: random.Random, tool: str = "") -> float:
        x = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(x, self.cap) if self.cap else x

    def mean(self) -> float:
        m = self.median * math.exp(self.sigma**2 / 2)
        return min(m, self.cap) if self.cap else m


class ReplaySampler(Sampler):
    """Per tool name, the recorded ``latency_s`` of ``"type": "tool"`` trace lines."""

    def __init__(self, by_tool: dict[str, list[float]]) -> None:
        if not by_tool:
            raise ScenarioError("replay: no tool lines with latency_s in the traces")
        self.by_tool = {k: sorted(v) for k, v in by_tool.items()}
        self.pool = sorted(x for v in by_tool.values() for x in v)

    @classmethod
    def from_files(cls, patterns: list[str]) -> ReplaySampler:
        files = sorted({f for p in patterns for f in glob.glob(p)} | _plain(patterns))
        if not files:
            raise ScenarioError(f"replay: no trace files match {patterns}")
        by_tool: dict[str, list[float]] = defaultdict(list)
        for f in files:
            for name, lat in read_tool_latencies(Path(f)):
                by_tool[name].append(lat)
        return cls(dict(by_tool))

    def sample(self, rng: random.Random, tool: str = "") -> float:
        values = self.by_tool.get(_base_name(tool)) or self.pool
        return rng.choice(values)

    def mean(self) -> float:
        return sum(self.pool) / len(self.pool)


def _plain(patterns: list[str]) -> set[str]:
    return {p for p in patterns if Path(p).is_file()}


def read_tool_latencies(path: Path) -> list[tuple[str, float]]:
    """(tool name, latency_s) of every ``type == "tool"`` line of one trace file."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ScenarioError(f"{path}:{n}: not JSON: {exc}") from exc
        if rec.get("type") != "tool" or not isinstance(rec.get("latency_s"), (int, float)):
            continue
        out.append((str(rec.get("name", "")), float(rec["latency_s"])))
    return out


def _base_name(tool: str) -> str:
    """Strip the per-run schema nonce (``search_docs__x1f3`` -> ``search_docs``)."""
    return tool.split("__", 1)[0]


# ---------------------------------------------------------------------------
# the scenario


class ToolLatency(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: Distribution = Field(
        default_factory=lambda: LogNormal(median=0.5, sigma=0.5, max=None)
    )
    per_tool: dict[str, Distribution] = Field(default_factory=dict)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    prompt: str
    steps: int = Field(3, ge=1, le=100, description="model calls per task (at most)")
    tools: list[str] | None = Field(None, description="tool names offered; default all")
    plan: list[str] | None = Field(None, description="tool per step for tool_choice=named")


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "scenario"
    description: str = ""
    system_prompt: str = "You are a helpful assistant. Use the tools to complete the task."
    tool_choice: ToolChoiceMode = "required"
    max_tokens: int = Field(64, ge=1)
    temperature: float = 0.0
    extra_body: dict[str, Any] = Field(default_factory=dict)
    fresh_schemas: bool = Field(
        True, description="suffix tool names with a per-run nonce so the first use is cold"
    )
    final_answer: bool = Field(
        False, description="after the last tool step, one more call with tool_choice=none"
    )
    result_chars: int = Field(600, ge=0, description="characters of each simulated tool result")
    think_time: Distribution = Field(default_factory=lambda: Fixed(value=0.0))
    tool_latency: ToolLatency = Field(default_factory=ToolLatency)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tasks: list[Task] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        names = [tool_name(t) for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("duplicate tool names")
        for task in self.tasks:
            for n in (task.tools or []) + (task.plan or []):
                if n not in names:
                    raise ValueError(f"task {task.name!r} names unknown tool {n!r}")
        if self.tool_choice in ("required", "named", "auto") and not self.tools:
            raise ValueError(f"tool_choice={self.tool_choice} needs tools")
        return self

    def tools_for(self, task: Task, nonce: str = "") -> list[dict[str, Any]]:
        wanted = task.tools or [tool_name(t) for t in self.tools]
        return [rename_tool(t, nonce) for t in self.tools if tool_name(t) in wanted]

    def mean_steps(self) -> float:
        return sum(t.steps + (1 if self.final_answer else 0) for t in self.tasks) / len(self.tasks)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tasks": len(self.tasks),
            "tools": [tool_name(t) for t in self.tools],
            "tool_choice": self.tool_choice,
            "mean_steps_per_task": self.mean_steps(),
            "max_tokens": self.max_tokens,
            "result_chars": self.result_chars,
            "think_time": self.think_time.model_dump(),
            "tool_latency": self.tool_latency.model_dump(),
        }


def tool_name(tool: dict[str, Any]) -> str:
    return str(tool.get("function", {}).get("name", ""))


def rename_tool(tool: dict[str, Any], nonce: str) -> dict[str, Any]:
    if not nonce:
        return tool
    fn = dict(tool["function"])
    fn["name"] = f"{fn['name']}__{nonce}"
    return {**tool, "function": fn}


def new_nonce() -> str:
    """Per-run schema nonce; random on purpose (a seeded one would be warm on rerun)."""
    return secrets.token_hex(3)


def load_scenario(path: str | Path | None = None) -> Scenario:
    path = Path(path) if path else DEFAULT_SCENARIO
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise ScenarioError(f"{path}: not valid YAML/JSON: {exc}") from exc
    return parse_scenario(data, str(path))


def parse_scenario(data: Any, where: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def parse_distribution(spec: str) -> Fixed | Uniform | LogNormal | Replay:
    """A latency from a flag: ``fixed:S``, ``uniform:LOW,HIGH``, ``lognormal:MEDIAN[,SIGMA
    [,MAX]]`` or ``replay:TRACE[,TRACE...]`` (agent trace files or globs)."""
    kind, _, rest = spec.partition(":")
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    try:
        if kind == "replay":
            return Replay(traces=parts)
        nums = [float(p) for p in parts]
        if kind == "fixed" and len(nums) == 1:
            return Fixed(value=nums[0])
        if kind == "uniform" and len(nums) == 2:
            return Uniform(low=nums[0], high=nums[1])
        if kind == "lognormal" and 1 <= len(nums) <= 3:
            return LogNormal(
                median=nums[0],
                sigma=nums[1] if len(nums) > 1 else 0.5,
                max=nums[2] if len(nums) > 2 else None,
            )
    except (ValueError, ValidationError) as exc:
        raise ScenarioError(f"bad latency {spec!r}: {exc}") from exc
    raise ScenarioError(
        f"bad latency {spec!r}: want fixed:S, uniform:LOW,HIGH, lognormal:MEDIAN[,SIGMA[,MAX]]"
        " or replay:TRACE[,TRACE]"
    )


def with_tool_latency(scenario: Scenario, spec: str) -> Scenario:
    """The scenario with every tool's latency replaced by one distribution (a flag)."""
    dist = parse_distribution(spec)
    return scenario.model_copy(update={"tool_latency": ToolLatency(default=dist)})


class ToolSimulator:
    """Latency and result text of simulated tools, seeded per agent."""

    def __init__(self, scenario: Scenario) -> None:
        self.default = scenario.tool_latency.default.sampler()
        self.per_tool = {k: d.sampler() for k, d in scenario.tool_latency.per_tool.items()}
        self.think = scenario.think_time.sampler()
        self.result_chars = scenario.result_chars

    def latency(self, rng: random.Random, tool: str) -> float:
        return self.per_tool.get(_base_name(tool), self.default).sample(rng, tool)

    def think_time(self, rng: random.Random) -> float:
        return self.think.sample(rng)

    def result(self, rng: random.Random, tool: str, arguments: str) -> str:
        """A JSON tool result of about ``result_chars`` characters (seeded filler)."""
        head = {"tool": _base_name(tool), "ok": True, "echo": arguments[:80]}
        budget = max(0, self.result_chars - len(json.dumps(head)) - 12)
        words: list[str] = []
        size = 0
        while size < budget:
            w = rng.choice(_WORDS)
            words.append(w)
            size += len(w) + 1
        return json.dumps({**head, "data": " ".join(words)[:budget]})


_WORDS = (
    "alpha beta cache commit config deploy error file function index latency line "
    "module network parser queue record request result schema server socket stack "
    "status table test thread token trace update user value vector worker"
).split()
