"""Agent settings (``LOOPSTACK_AGENT_*``) and the endpoint they point at.

`AgentSettings` is read once by the CLI and unpacked into `Limits` and keyword arguments;
the loop itself never sees the settings object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_BASE_URL", "AgentSettings", "Limits", "resolve_api_key", "resolve_base_url"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


@dataclass(frozen=True, slots=True)
class Limits:
    """Guardrails of one run; all on by default."""

    max_steps: int = 8  # model calls that may choose tools
    max_tool_calls: int = 16
    max_tokens: int = 40_000  # prompt + completion tokens over the run, from `usage`
    wall_clock_s: float = 300.0
    tool_timeout_s: float = 30.0
    no_progress_steps: int = 3  # steps without a new successful observation
    repeat_nudges: int = 1  # identical repeats answered with a hint before the forced answer
    context_tokens: int = 5_000  # compaction threshold
    keep_turns: int = 4  # turns kept verbatim when compacting
    step_max_tokens: int = 512  # max_tokens of each model call
    answer_max_tokens: int = 384  # max_tokens of the final-answer request
    max_replans: int = 2  # re-plans after failed plan steps (agent.plan)
    max_depth: int = 2  # levels of workers below the top agent (agent.team)
    max_fan_out: int = 4  # sub-tasks handed out in one turn (agent.team)


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOOPSTACK_AGENT_", extra="ignore")

    max_steps: int = Field(default=8, ge=1)
    max_tool_calls: int = Field(default=16, ge=0)
    max_tokens: int = Field(default=40_000, ge=100, description="token budget per run")
    wall_clock_s: float = Field(default=300.0, gt=0)
    tool_timeout_s: float = Field(default=30.0, gt=0)
    no_progress_steps: int = Field(default=3, ge=1)
    repeat_nudges: int = Field(
        default=1,
        ge=0,
        description="times an identical repeated call is answered with a hint (use the result, "
        "change the arguments or another tool) before the final answer is forced",
    )
    context_tokens: int = Field(default=5_000, ge=256, description="compaction threshold")
    keep_turns: int = Field(default=4, ge=1)
    step_max_tokens: int = Field(default=512, ge=16)
    answer_max_tokens: int = Field(default=384, ge=16)
    max_replans: int = Field(default=2, ge=0, description="re-plans after failed steps")
    max_depth: int = Field(default=2, ge=0, description="levels of workers below the top agent")
    max_fan_out: int = Field(default=4, ge=1, description="sub-tasks handed out per turn")
    plan: Literal["auto", "always", "never"] = Field(
        default="never", description="make a plan before the first step (agent.plan)"
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
        default=None, description="JSON file of worked examples (bench.golden.bootstrap)"
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
        description="offer a final_answer tool: the model answers by a call (agent.selection)",
    )
    model: str | None = Field(default=None, description="default: first chat model listed")
    tokenizer: str | None = Field(default=None, description="local HF folder for counting")
    otel_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint")
    request_timeout_s: float = Field(default=300.0, gt=0)

    def limits(self, **overrides: int | float | None) -> Limits:
        fields = {f: getattr(self, f) for f in Limits.__dataclass_fields__}
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return Limits(**fields)


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
