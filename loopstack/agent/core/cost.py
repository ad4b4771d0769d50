"""What a task cost: tokens (prompt, cached prompt, completion), model calls, tool calls and
wall time, per agent and summed over a team.

`Cost` is the unit in every run result (``RunResult.cost``, the ``cost`` of ``--json``) and
in each worker's record. Tokens come from the server's ``usage``; ``cached_prompt_tokens``
from ``usage.prompt_tokens_details.cached_tokens`` where the server gives it (ours does,
vLLM needs ``--enable-prompt-tokens-details``), else 0. A coordinator's cost is its own
spending plus everything its workers spent (`Cost.plus`); the workers' own records keep
theirs apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Cost", "cached_tokens_of"]


@dataclass(slots=True)
class Cost:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, other: Cost) -> Cost:
        """The sum of two costs (wall time is *not* summed: the caller sets its own)."""
        return Cost(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_prompt_tokens + other.cached_prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.model_calls + other.model_calls,
            self.tool_calls + other.tool_calls,
            self.wall_s,
        )

    def add(self, other: Cost) -> None:
        """Charge ``other`` (a worker's spending) to this cost, in place."""
        for f in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.model_calls += other.model_calls
        self.tool_calls += other.tool_calls

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["wall_s"] = round(self.wall_s, 3)
        return out


def cached_tokens_of(usage: Any) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (object or dict), 0 when absent."""
    details = getattr(usage, "prompt_tokens_details", None)
    if details is None and isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        return int(details.get("cached_tokens") or 0)
    return int(getattr(details, "cached_tokens", 0) or 0)
