"""Agent settings (``LOOPSTACK_AGENT_*``), how an agent runs, and the endpoint it talks to.

`AgentSettings` is read once by the CLI and turned into an `AgentConfig` (the `Limits`, the
final-answer `AnswerOptions`, tool selection, planning, tracing): the loop itself never
sees the settings object. Tests, teams and benches build an `AgentConfig` directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, get_type_hints

from pydantic import Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from loopstack.agent.core.selection import ToolSelection

__all__ = [
    "DEFAULT_BASE_URL",
    "AgentConfig",
    "AgentSettings",
    "AnswerOptions",
    "Limits",
    "PlanMode",
    "resolve_api_key",
    "resolve_base_url",
]

PlanMode = Literal["auto", "always", "never"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

_T = TypeVar("_T")


def _limit(default: _T, *, description: str = "", **bounds: float) -> _T:
    """A `Limits` field: its default, and the bounds and description `AgentSettings` checks and
    shows for ``LOOPSTACK_AGENT_<NAME>`` (the one place each limit is declared)."""
    meta: dict[str, Any] = dict(bounds)
    if description:
        meta["description"] = description
    return cast(_T, field(default=default, metadata=meta))


@dataclass(frozen=True, slots=True)
class Limits:
    """Guardrails of one run; all on by default. `AgentSettings` reads its fields from here."""

    max_steps: int = _limit(8, ge=1)  # model calls that may choose tools
    max_tool_calls: int = _limit(16, ge=0)
    max_tokens: int = _limit(  # prompt + completion tokens over the run, from `usage`
        40_000, ge=100, description="token budget per run (each chat turn)"
    )
    wall_clock_s: float = _limit(300.0, gt=0)
    tool_timeout_s: float = _limit(30.0, gt=0)
    no_progress_steps: int = _limit(3, ge=1)  # steps without a new successful observation
    repeat_nudges: int = _limit(
        1,
        ge=0,
        description="times an identical repeated call is answered with a hint (use the result, "
        "change the arguments or another tool) before the final answer is forced",
    )
    context_tokens: int = _limit(5_000, ge=256, description="compaction threshold")
    keep_turns: int = _limit(4, ge=1)  # turns kept verbatim when compacting
    step_max_tokens: int = _limit(512, ge=16)  # max_tokens of each model call
    answer_max_tokens: int = _limit(384, ge=16)  # max_tokens of the final-answer request
    max_replans: int = _limit(  # (loopstack.agent.run.plan)
        2, ge=0, description="re-plans after failed plan steps"
    )
    plan_pushes: int = (
        _limit(  # (loopstack.agent.run.plan); off: measured, no gain (docs/benchmarks.md)
            0, ge=0, description="text answers sent back while 2+ plan steps are open"
        )
    )
    max_depth: int = _limit(  # (loopstack.agent.run.team)
        2, ge=0, description="levels of workers below the top agent"
    )
    max_fan_out: int = _limit(  # (loopstack.agent.run.team)
        4, ge=1, description="sub-tasks handed out in one turn"
    )


def settings_fields(cls: type) -> dict[str, Any]:
    """A dataclass's fields as pydantic field definitions: type, default, bounds, description."""
    hints = get_type_hints(cls)
    return {f.name: (hints[f.name], Field(default=f.default, **f.metadata)) for f in fields(cls)}


if TYPE_CHECKING:
    _LimitSettings = BaseSettings
else:  # every `Limits` field as a setting, default and bounds from `Limits`
    _LimitSettings = create_model(
        "_LimitSettings", __base__=BaseSettings, **settings_fields(Limits)
    )


@dataclass(frozen=True, slots=True)
class AnswerOptions:
    """How the final answer is asked for (loopstack.agent.run.answer); the defaults are what the
    golden set measured best (docs/benchmarks.md)."""

    typed: bool = (
        False  # loopstack.agent.run.answer_kinds: a typed ``value`` chosen from the question
    )
    samples: int = 1  # self-consistency: n samples in one request, the majority wins
    examples: str = ""  # worked examples (loopstack.agent.examples) put before the request


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """How an agent runs, the same for every run it makes: its guardrails and the loop's
    choices. What it talks to and who it answers to (client, tools, approver, memory) are
    the `Agent`'s own arguments."""

    limits: Limits = field(default_factory=Limits)
    # the tools a run may call, fixed by the host (default: every tool of the registry);
    # nothing the model or a tool says changes it
    allow: frozenset[str] | None = None
    # force: a text reply triggers the JSON final-answer request; accept: the text is it
    text_answers: Literal["force", "accept"] = "force"
    # a text reply before any tool call (and without a memory block to answer from) is asked
    # once more with tool_choice="required": small models guess instead of looking
    tool_nudge: bool = True
    plan: PlanMode = "never"  # a plan before the first step (loopstack.agent.run.plan)
    instructions: str = ""  # added to the system prompt (a worker's role)
    answer: AnswerOptions = field(default_factory=AnswerOptions)
    # measurement only (LOOPSTACK_AGENT_ANSWER_ARMS): the final answer also asked these
    # ways on the same state, recorded in the trace (loopstack.agent.run.answer.shadow_answers)
    answer_arms: tuple[tuple[str, AnswerOptions], ...] = ()
    selection: ToolSelection = field(default_factory=ToolSelection)  # which tools, how
    trace_dir: Path | None = None  # default: $LOOPSTACK_HOME/traces
    otel_endpoint: str | None = None  # OTLP/HTTP traces, besides the JSONL file


class AgentSettings(_LimitSettings):
    """The agent's settings: the `Limits` (inherited, declared once there), then the rest."""

    model_config = SettingsConfigDict(env_prefix="LOOPSTACK_AGENT_", extra="ignore")

    plan: PlanMode = Field(
        default="never", description="make a plan before the first step (loopstack.agent.run.plan)"
    )
    text_answers: Literal["force", "accept"] = Field(
        default="force",
        description="force: a text reply triggers the JSON final-answer request; accept: "
        "the text is the answer",
    )
    tool_nudge: bool = Field(
        default=True,
        description="a text reply before any tool call is asked again with tool_choice=required",
    )
    answer_typed: bool = Field(
        default=False, description="final answer with a typed value chosen from the question"
    )
    answer_samples: int = Field(
        default=1, ge=1, le=16, description="self-consistency: samples of the final answer"
    )
    examples: str | None = Field(
        default=None, description="JSON file of worked examples (loopstack.bench.golden.bootstrap)"
    )
    answer_arms: str = Field(
        default="",
        description="measurement only: comma list of typed, samples, examples - the final "
        "answer is also asked that way on the same state and recorded in the trace",
    )
    select: Literal["given", "ranked"] = Field(
        default="given",
        description="tool order per run: as given, or ranked by relevance to the goal "
        "(loopstack.tool_rank: loopstack endpoints only)",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="ranked: offer the k best tools (more_tools shows the rest)"
    )
    no_repeat: bool = Field(
        default=False,
        description="the server's grammar refuses a call identical to one already answered "
        "(loopstack.no_repeat: loopstack endpoints only)",
    )
    answer_tool: bool = Field(
        default=False,
        description="offer a final_answer tool: the model answers by a call "
        "(loopstack.agent.core.selection); its requests say loopstack.tool_rank: null (loopstack "
        "endpoints, or ones that ignore unknown fields)",
    )
    model: str | None = Field(default=None, description="default: first chat model listed")
    tokenizer: str | None = Field(default=None, description="local HF folder for counting")
    otel_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint")
    request_timeout_s: float = Field(default=300.0, gt=0)

    def limits(self, **overrides: int | float | None) -> Limits:
        values = {f.name: getattr(self, f.name) for f in fields(Limits)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Limits(**values)


def resolve_base_url(explicit: str | None = None) -> str:
    """--base-url, else LOOPSTACK_BASE_URL, else OPENAI_BASE_URL, else the local server."""
    for value in (
        explicit,
        os.environ.get("LOOPSTACK_BASE_URL"),
        os.environ.get("OPENAI_BASE_URL"),
    ):
        if value:
            return value.rstrip("/")
    return DEFAULT_BASE_URL


def resolve_api_key() -> str:
    return os.environ.get("LOOPSTACK_API_KEY") or os.environ.get("OPENAI_API_KEY") or "not-needed"
