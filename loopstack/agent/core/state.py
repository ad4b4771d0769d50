"""The agent's state and the steps its loop yields.

`AgentState` is everything one run knows: the pinned goal and facts, the plan, the
observations (tool results), the message history, token usage and the final status.
The loop (`loopstack.agent.run.loop.Agent.steps`) is an async generator of the small `Step`
dataclasses below; `RunResult.fold` turns the stream into the run's result, so ``run()`` is one
fold.

Statuses and reasons: a run ends ``done`` (an answer was produced), ``max_steps`` (a step
or call limit, or no progress), ``budget`` (tokens or wall clock), ``refused`` (the model
kept asking for a call the host refuses: a tool outside the allowlist, reason
``not_allowed``, or a call nobody approved, ``denied``) or ``error`` (the model endpoint
failed). ``reason`` says which limit: see `Reason`.

`RunResult` counts as `cost` does: ``tool_calls`` are the calls this agent made on the host
(``cost.tool_calls`` less its workers'), ``refused`` the calls it did not run (repeats and
calls over ``max_tool_calls``), ``tokens`` the run's total with its workers' (``cost``'s)
and ``own_total`` this agent's alone.
"""

from __future__ import annotations

import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from loopstack.agent.core.cost import Cost
from loopstack.agent.core.selection import RunTools

Status = Literal["done", "max_steps", "budget", "refused", "error"]
Reason = Literal[
    "answer",  # the model answered (text, then a forced final answer)
    "repeated_call",  # the model repeated an identical call: answered from observations
    "no_progress",  # several steps without a new observation
    "max_steps",
    "max_tool_calls",
    "tokens",
    "wall_clock",
    "model_error",
    "not_allowed",  # the model kept calling a tool outside the run's allowlist
    "denied",  # the model kept making a call the host did not approve
]
STATUS_OF: dict[Reason, Status] = {
    "answer": "done",
    "repeated_call": "done",
    "no_progress": "max_steps",
    "max_steps": "max_steps",
    "max_tool_calls": "max_steps",
    "tokens": "budget",
    "wall_clock": "budget",
    "model_error": "error",
    "not_allowed": "refused",
    "denied": "refused",
}
#: Tool errors that are the host's refusal, not a run: the call is listed under
#: ``RunResult.refused`` and does not count against ``max_tool_calls``.
NOT_RUN = frozenset({"repeated_call", "limit"})


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    last_prompt_tokens: int = 0  # prompt size of the latest model call (context counting)
    cached_prompt_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens, summed

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, prompt: int, completion: int, cached: int = 0) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_prompt_tokens += cached
        self.last_prompt_tokens = prompt
        self.calls += 1


PlanStatus = Literal["pending", "running", "done", "failed", "skipped"]


@dataclass(slots=True)
class PlanItem:
    """One step of a plan: what to achieve, how far it got, what it found."""

    goal: str
    status: PlanStatus = "pending"
    result: str = ""

    def to_json(self) -> dict[str, str]:
        return {"goal": self.goal, "status": self.status, "result": self.result}


@dataclass(slots=True)
class Plan:
    """The run's plan (`loopstack.agent.run.plan` makes, advances and re-plans it)."""

    items: list[PlanItem] = field(default_factory=list)
    replans: int = 0

    def current(self) -> PlanItem | None:
        return next((i for i in self.items if i.status in ("pending", "running")), None)

    def to_json(self) -> list[dict[str, str]]:
        return [i.to_json() for i in self.items]


@dataclass(slots=True)
class Observation:
    """One executed (or refused) tool call and its structured result."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    status: Literal["ok", "error"]
    content: str  # what the model saw (JSON of the ToolResult)
    trace_id: str
    step: int


@dataclass(slots=True)
class AgentState:
    goal: str
    run_id: str = field(default_factory=new_run_id)
    user_messages: list[str] = field(default_factory=list)  # what the user said (trusted)
    pinned: dict[str, str] = field(default_factory=dict)  # key facts, always in the prompt
    plan: Plan | None = None  # set when planning is on (loopstack.agent.run.plan)
    memory_block: str = ""
    summary: str = ""  # compacted older turns
    messages: list[dict[str, Any]] = field(default_factory=list)  # history after the system
    observations: list[Observation] = field(default_factory=list)
    untrusted: list[str] = field(default_factory=list)  # raw tool outputs (injection check)
    step: int = 0
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    started: float = field(default_factory=time.monotonic)
    status: Status | None = None
    reason: Reason | None = None
    answer: str = ""
    # teams: workers' records ({name, task, status, answer, steps, cost}), the sub-tasks
    # already handed out (loop guard) and what the workers spent (charged to this run)
    workers: list[dict[str, Any]] = field(default_factory=list)
    delegated: dict[str, str] = field(default_factory=dict)
    charged: Cost = field(default_factory=Cost)
    run_tools: RunTools = field(
        default_factory=RunTools
    )  # tool selection (loopstack.agent.core.selection)
    # tokens spent before this turn (a chat session's earlier turns): the token budget is
    # per turn, like steps, tool calls and the clock; ``cost()`` stays the whole session's
    turn_tokens_from: int = 0
    turn_calls_from: int = 0  # workers' tool calls charged before this turn
    # a worker's: the user's request its task is one part of (loopstack.agent.run.team). Said in its
    # system prompt, and trusted like the user's words: a small coordinator writes terse
    # tasks ("current", "convert_eur_to_jpy") that drop the city, the amount, the month
    request: str = ""

    def __post_init__(self) -> None:
        if not self.user_messages:
            self.user_messages.append(self.goal)
        if self.request and self.request not in self.user_messages:
            self.user_messages.append(self.request)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def cost(self) -> Cost:
        """This run's own spending plus what its workers spent."""
        own = Cost(
            self.usage.prompt_tokens,
            self.usage.cached_prompt_tokens,
            self.usage.completion_tokens,
            self.usage.calls,
            self.tool_calls,
            self.elapsed(),
        )
        return own.plus(self.charged)

    def spent_tokens(self) -> int:
        """Tokens counted against this turn's budget: its own and its workers', since the
        turn began (a run is one turn; a chat session's further turns each start at 0)."""
        return self.usage.total + self.charged.tokens - self.turn_tokens_from

    def turn_tool_calls(self) -> int:
        """Tool calls counted against this turn's limit: its own and its workers'."""
        return self.tool_calls + self.charged.tool_calls - self.turn_calls_from


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where an agent runs in a team (loopstack.agent.run.team): how deep, under whom, and the
    parent's (run id, step trace id) its trace lines point at."""

    depth: int = 0  # 0: the top-level agent; a worker runs at its parent's depth + 1
    ancestors: tuple[str, ...] = ()  # names of the agents above (no ping-pong)
    trace_parent: tuple[str, str] | None = None


@dataclass(slots=True)
class Turn:
    """The calls of one assistant message, as a tool sees them while it runs: the agent and
    state that called it (a worker agent charges its parent through these) and how many
    sub-tasks this turn has handed out so far (the fan-out limit)."""

    agent: Any
    state: AgentState
    calls: int
    depth: int = 0  # 0: the top-level agent; a worker runs at its parent's depth + 1
    ancestors: tuple[str, ...] = ()  # names of the agents above (no ping-pong)
    handed_out: int = 0


CURRENT_TURN: ContextVar[Turn | None] = ContextVar("loopstack_turn", default=None)
# the trace id of the tool call running in this task (a worker's trace points at it)
CURRENT_CALL: ContextVar[str] = ContextVar("loopstack_call", default="")


# --- steps -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelStep:
    """The model decided: call tools, or answer in text."""

    step: int
    trace_id: str
    decision: Literal["tool_calls", "answer"]
    calls: tuple[tuple[str, dict[str, Any]], ...]
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call ran (or was refused) on the host."""

    step: int
    trace_id: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    status: Literal["ok", "error"]
    summary: str
    chars: int
    latency_s: float
    error_type: str | None = None
    attempts: int = (
        1  # loopstack.agent.tools.retry: calls made for this one (transient failures retried)
    )
    retried: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompactionStep:
    step: int
    trace_id: str
    dropped_messages: int
    tokens_before: int
    summary: str
    latency_s: float


@dataclass(frozen=True, slots=True)
class LimitStep:
    """A guardrail fired; the run now concludes (best-effort answer follows)."""

    step: int
    trace_id: str
    reason: Reason
    detail: str
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class FinalStep:
    step: int
    trace_id: str
    status: Status
    reason: Reason
    answer: str
    forced: bool  # produced by the final-answer request (or from observations)
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    repairs: tuple[
        str, ...
    ] = ()  # what `loopstack.agent.run.grounding` corrected in a forced answer
    arms: tuple[tuple[str, str], ...] = ()  # measurement only: other ways of asking (loop)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """A plan was made (``kind="plan"``) or remade after a failed step (``"replan"``)."""

    step: int
    trace_id: str
    kind: Literal["plan", "replan"]
    items: tuple[dict[str, str], ...]
    detail: str  # why it was (re)made: the failed step and its error
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class ErrorStep:
    """A fatal error (the endpoint failed); a FinalStep with status ``error`` follows."""

    step: int
    trace_id: str
    message: str
    latency_s: float = 0.0


Step = ModelStep | ToolStep | CompactionStep | LimitStep | FinalStep | ErrorStep | PlanStep


@dataclass(slots=True)
class RunResult:
    run_id: str
    status: Status = "error"
    reason: Reason = "model_error"
    answer: str = ""
    steps: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # run on the host
    refused: list[dict[str, Any]] = field(default_factory=list)  # not run: repeat, over limit
    tokens: dict[str, int] = field(default_factory=dict)  # with the workers', as `cost`
    trace_path: str = ""
    elapsed_s: float = 0.0
    history: list[Step] = field(default_factory=list)
    plan: list[dict[str, str]] | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)

    def close(self, state: AgentState, trace_path: str = "") -> RunResult:
        """What only the state knows at the end: tokens, cost, plan, workers."""
        self.cost = state.cost()
        self.tokens = {  # the team's, as `cost` counts them; ``own_total``: this agent's
            "prompt": self.cost.prompt_tokens,
            "completion": self.cost.completion_tokens,
            "total": self.cost.tokens,
            "own_total": state.usage.total,
        }
        self.plan = state.plan.to_json() if state.plan is not None else None
        self.workers = list(state.workers)
        self.trace_path = trace_path
        self.elapsed_s = state.elapsed()
        return self

    def fold(self, step: Step) -> RunResult:
        """Add one step (the reducer ``run()`` applies to the stream)."""
        self.history.append(step)
        if isinstance(step, ModelStep):
            self.steps = max(self.steps, step.step)
        elif isinstance(step, ToolStep) and step.error_type in NOT_RUN:
            self.refused.append(
                {"name": step.name, "arguments": step.arguments, "reason": step.error_type}
            )
        elif isinstance(step, ToolStep):
            self.tool_calls.append(
                {"name": step.name, "arguments": step.arguments, "status": step.status}
            )
        elif isinstance(step, FinalStep):
            self.status, self.reason, self.answer = step.status, step.reason, step.answer
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "answer": self.answer,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "refused": self.refused,
            "tokens": self.tokens,
            "trace_path": self.trace_path,
            "run_id": self.run_id,
            "elapsed_s": round(self.elapsed_s, 3),
            "plan": self.plan,
            "workers": self.workers,
            "cost": self.cost.to_json(),
        }
