"""``loopstack agent``: run a goal, chat, and show traces.

    loopstack agent run "GOAL" [--tools FILE.py] [--plan auto|always|never] [--team team.yaml]
                               [--mcp "CMD ARGS"]... [--mcp-env K=V]... [--mcp-header H=V]...
                               [--retry NAME=N]... [--user ID] [--max-steps N]
                               [--base-url URL] [--json]
    loopstack agent chat --tools FILE.py
    loopstack agent trace show RUN
    loopstack agent explain RUN                      (input, memory block, recall's choices)

Exit codes of ``run``: 0 done, 3 max_steps, 4 budget, 5 error, 2 bad arguments
(loopstack.agent.observe.handoff); ``--on-unfinished CMD`` / ``--handoff-url URL`` hand an
unfinished run on.

Endpoint: ``--base-url``, else ``LOOPSTACK_BASE_URL``, else ``OPENAI_BASE_URL``, else
``http://127.0.0.1:8000/v1``; key ``LOOPSTACK_API_KEY`` or ``OPENAI_API_KEY``; model: the
first chat model ``/v1/models`` lists. ``--json`` prints one JSON object as the last line:
``status, reason, answer, steps, tool_calls, refused, tokens, trace_path, run_id, elapsed_s, plan,
workers, cost`` (``cost`` summed over the team; see loopstack.agent.core.cost).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from openai import AsyncOpenAI

from loopstack.agent import examples
from loopstack.agent.core.cost import Cost
from loopstack.agent.core.selection import ToolSelection
from loopstack.agent.core.settings import (
    AgentConfig,
    AgentSettings,
    AnswerOptions,
    resolve_api_key,
    resolve_base_url,
)
from loopstack.agent.core.state import (
    AgentState,
    FinalStep,
    ModelStep,
    PlanStep,
    RunResult,
    ToolStep,
)
from loopstack.agent.exceptions import AgentError, ConfigError
from loopstack.agent.observe.handoff import CONFIG_ERROR, Handoff, exit_code
from loopstack.agent.run.guard import ApprovalRequest, Approver, terminal_approver
from loopstack.agent.run.loop import Agent
from loopstack.agent.tools.mcp import MCPToolServer
from loopstack.agent.tools.mcp_config import server_spec
from loopstack.agent.tools.registry import ToolRegistry, load_tools_file
from loopstack.agent.tools.retry import parse_retry

app = typer.Typer(help="Run tool-using agents against an OpenAI-compatible endpoint.")
trace_app = typer.Typer(help="Inspect run traces ($LOOPSTACK_HOME/traces).")
app.add_typer(trace_app, name="trace")

logger = logging.getLogger(__name__)


class PlanChoice(StrEnum):
    auto = "auto"
    always = "always"
    never = "never"


_EMBEDDING_HINTS = ("minilm", "embed", "bge-", "e5-", "gte-")

TOOLS_OPT = typer.Option(None, "--tools", help="Python file: its typed, documented functions.")
MCP_OPT = typer.Option(None, "--mcp", help='MCP server command, e.g. "uvx mcp-server-time".')
MCP_ENV_OPT = typer.Option(
    None,
    "--mcp-env",
    help="[SERVER:]KEY=VALUE for the --mcp servers (${VAR} from the host), or KEY alone to "
    "pass the host's KEY; repeatable. Nothing else of the host environment is passed.",
)
MCP_HEADER_OPT = typer.Option(
    None,
    "--mcp-header",
    help="[SERVER:]Name=Value sent to streamable-HTTP --mcp servers, e.g. "
    "'Authorization=Bearer ${TOKEN}' (${VAR} from the host); repeatable.",
)
ALLOW_OPT = typer.Option(None, "--allow", help="Only these tools (repeatable).")
MEMORY_TOOLS_OPT = typer.Option(
    False, "--memory-tools", help="Also offer recall_memory/save_memory as tools."
)


async def pick_model(client: AsyncOpenAI) -> str:
    """The first model ``/v1/models`` lists that is not an embedding model."""
    ids = [m.id async for m in client.models.list()]
    for mid in ids:
        if not any(h in mid.lower() for h in _EMBEDDING_HINTS):
            return mid
    if ids:
        return ids[0]
    raise ConfigError("the endpoint lists no model: pass --model")


@asynccontextmanager
async def build_agent(
    *,
    tools: list[Path],
    mcp: list[str],
    user: str,
    memory: bool,
    mcp_env: list[str] | None = None,
    mcp_headers: list[str] | None = None,
    retries: list[str] | None = None,
    memory_tools: bool = False,
    base_url: str | None,
    model: str | None,
    allow: list[str] | None,
    approve_dangerous: bool,
    overrides: dict[str, Any],
    client: AsyncOpenAI | None = None,
    plan: str | None = None,
    team: Path | None = None,
) -> AsyncIterator[Agent]:
    """Everything a CLI run needs, closed again on exit (MCP servers, memory store)."""
    settings = AgentSettings()
    async with AsyncExitStack() as stack:
        if client is None:
            client = AsyncOpenAI(
                base_url=resolve_base_url(base_url),
                api_key=resolve_api_key(),
                timeout=settings.request_timeout_s,
                max_retries=2,
            )
            stack.push_async_callback(client.close)
        registry = ToolRegistry()
        for f in tools:
            registry.add_all(load_tools_file(f), group=f.stem)
        # Mounted tool lists are added here; each server stays up until the stack closes.
        limits = settings.limits(**overrides)
        for text in mcp:  # calls time out with the run's tool timeout; startup gets >= 30 s
            spec = server_spec(
                text,
                timeout_s=limits.tool_timeout_s,
                env=mcp_env or (),
                headers=mcp_headers or (),
            )
            server = await stack.enter_async_context(MCPToolServer(spec))
            registry.add_all(server.tools, group=f"mcp:{spec.name}")
        registry.retry.update(parse_retry(retries or []))
        link = None
        if memory:
            from loopstack.agent.run.longterm import StoreMemory, open_store

            store = await open_store().open()
            stack.push_async_callback(store.close)
            link = StoreMemory(store, user_id=user)
            if memory_tools:  # recall and write-back happen anyway; the tools are extra choices
                registry.add_all(link.tools(), group="memory")
        instructions = ""
        if team is not None:
            from loopstack.agent.run.team import (
                COORDINATOR_INSTRUCTIONS,
                load_team,
                mount_team,
                worker_tools,
            )

            config = load_team(team)
            memory_for: Any = None
            if link is not None:
                from loopstack.agent.run.longterm import StoreMemory

                def memory_for(name: str) -> StoreMemory:  # the worker's own scope
                    return StoreMemory(store, user_id=user, agent_id=name)

            workers = await mount_team(
                config, team.parent, stack, settings.limits(), memory_for=memory_for
            )
            registry.add_all(worker_tools(workers), group="workers")
            instructions = COORDINATOR_INSTRUCTIONS + "\n" + config.coordinator.instructions
        approver: Approver | None = terminal_approver()
        if approve_dangerous:
            approver = _approve_dangerous(approver)
        model_id = model or settings.model or await pick_model(client)
        agent_config = AgentConfig(
            limits=limits,
            allow=frozenset(allow) if allow else None,
            text_answers=settings.text_answers,
            tool_nudge=settings.tool_nudge,
            plan=plan or settings.plan,  # type: ignore[arg-type]
            instructions=instructions.strip(),
            answer=_answer_options(settings, registry.names()),
            answer_arms=tuple(
                (arm.partition("=")[0], _answer_options(settings, registry.names(), arm))
                for arm in filter(None, settings.answer_arms.split(","))
            ),
            selection=ToolSelection(
                settings.select, settings.top_k, settings.no_repeat, settings.answer_tool
            ),
            otel_endpoint=settings.otel_endpoint,
        )
        agent = Agent(client, model_id, registry, agent_config, approver=approver, memory=link)
        if settings.tokenizer:
            from loopstack.agent.core.context import TokenCounter

            agent.counter = TokenCounter(settings.tokenizer)
        yield agent


def _answer_options(
    settings: AgentSettings, tools: list[str], arm: str | None = None
) -> AnswerOptions:
    """How the final answer is asked: the settings, or for a measurement arm (``typed``,
    ``samples``, ``examples=FILE``) the defaults with only that one option on."""
    if arm is None:
        typed, samples, file = settings.answer_typed, settings.answer_samples, settings.examples
    else:
        kind, _, file_arg = arm.partition("=")
        if kind not in ("typed", "samples", "examples") or (kind == "examples") != bool(file_arg):
            raise ConfigError(f"unknown answer arm {arm!r}: typed, samples or examples=FILE")
        typed, samples, file = kind == "typed", 5 if kind == "samples" else 1, file_arg or None
    shown = examples.render(examples.load(file), tools) if file else ""
    return AnswerOptions(typed=typed, samples=samples, examples=shown)


def _approve_dangerous(fallback: Approver | None) -> Approver:
    """--approve: dangerous tools run; suspicious (possibly injected) calls still ask."""

    async def approve(req: ApprovalRequest) -> bool:
        if req.why == "dangerous":
            return True
        from loopstack.agent.run.guard import ask

        return await ask(fallback, req)

    return approve


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        for noisy in ("httpx", "openai", "sentence_transformers"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def run(
    goal: str = typer.Argument(..., help="What the agent should do."),
    tools: list[Path] = TOOLS_OPT,
    plan: PlanChoice | None = typer.Option(
        None,
        "--plan",
        case_sensitive=False,
        help="Plan first: always, auto (when the model marks the goal multi-step), never "
        "(default; LOOPSTACK_AGENT_PLAN).",
    ),
    team: Path | None = typer.Option(
        None, "--team", help="Team file (YAML): workers the agent hands sub-tasks to."
    ),
    mcp: list[str] = MCP_OPT,
    mcp_env: list[str] = MCP_ENV_OPT,
    mcp_header: list[str] = MCP_HEADER_OPT,
    user: str = typer.Option("default", "--user", help="Memory is kept per user."),
    max_steps: int | None = typer.Option(None, "--max-steps", min=1),
    max_tool_calls: int | None = typer.Option(None, "--max-tool-calls", min=0),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Token budget of the run."),
    wall_clock: float | None = typer.Option(None, "--timeout", help="Wall-clock limit (s)."),
    tool_timeout: float | None = typer.Option(None, "--tool-timeout"),
    base_url: str | None = typer.Option(None, "--base-url"),
    model: str | None = typer.Option(None, "--model"),
    allow: list[str] = ALLOW_OPT,
    approve: bool = typer.Option(False, "--approve", help="Allow dangerous tools."),
    memory: bool = typer.Option(True, "--memory/--no-memory"),
    memory_tools: bool = MEMORY_TOOLS_OPT,
    retry: list[str] = typer.Option(
        None,
        "--retry",
        help="NAME=ATTEMPTS: retry this tool (or fnmatch pattern) on timeouts, connection "
        "and 5xx errors, with backoff; repeatable.",
    ),
    on_unfinished: str | None = typer.Option(
        None,
        "--on-unfinished",
        help="Command run with the run's summary JSON on stdin when it ends without finishing.",
    ),
    handoff_url: str | None = typer.Option(
        None,
        "--handoff-url",
        help="Local webhook (localhost only) POSTed the summary JSON of an unfinished run.",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on the last line."),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Run one goal to a final answer. Exit code: 0 done, 3 max_steps, 4 budget, 5 error,
    2 bad arguments (README: Exit codes and hand-off)."""
    _setup_logging(verbose)
    overrides = {
        "max_steps": max_steps,
        "max_tool_calls": max_tool_calls,
        "max_tokens": max_tokens,
        "wall_clock_s": wall_clock,
        "tool_timeout_s": tool_timeout,
    }

    async def go() -> RunResult:
        handoff = Handoff(on_unfinished, handoff_url)
        async with build_agent(
            tools=tools or [],
            mcp=mcp or [],
            mcp_env=mcp_env or [],
            mcp_headers=mcp_header or [],
            user=user,
            memory=memory,
            memory_tools=memory_tools,
            base_url=base_url,
            model=model,
            allow=allow,
            approve_dangerous=approve,
            overrides=overrides,
            plan=plan.value if plan is not None else None,
            team=team,
            retries=retry or [],
        ) as agent:
            result = await agent.run(goal, on_step=None if as_json else _echo_step)
        summary = {"goal": goal, **result.to_json()}
        await handoff(summary)
        return result

    try:
        result = asyncio.run(go())
    except (AgentError, OSError) as exc:
        message = exc.message if isinstance(exc, AgentError) else str(exc)
        if as_json:
            out = {"status": "error", "reason": "config_error", "answer": "", "steps": 0}
            out |= {"tool_calls": [], "trace_path": "", "plan": None, "workers": []}
            out |= {"cost": Cost().to_json(), "error": message}
            typer.echo(json.dumps(out))
        else:
            typer.echo(f"error: {message}", err=True)
        raise typer.Exit(CONFIG_ERROR) from exc
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False, default=str))
    else:
        typer.echo(f"\n{result.answer}\n")
        c = result.cost
        typer.echo(
            f"[{result.status} ({result.reason}), {result.steps} steps, "
            f"{len(result.workers)} worker runs; cost: {c.model_calls} model calls, "
            f"{c.tool_calls} tool calls, {c.prompt_tokens}+{c.completion_tokens} tokens "
            f"({c.cached_prompt_tokens} cached), {c.wall_s:.1f} s; trace: {result.trace_path}]",
            err=True,
        )
    raise typer.Exit(exit_code(result.status))


def _echo_step(step: Any) -> None:
    if isinstance(step, ModelStep) and step.decision == "tool_calls":
        for name, args in step.calls:
            typer.echo(f"-> {name}({json.dumps(args, ensure_ascii=False)})", err=True)
    elif isinstance(step, ToolStep):
        typer.echo(f"<- {step.name}: {step.status}: {step.summary[:160]}", err=True)
    elif isinstance(step, PlanStep):
        goals = "; ".join(f"{i + 1}. {x['goal']}" for i, x in enumerate(step.items))
        typer.echo(f"== {step.kind}: {goals}", err=True)
    elif isinstance(step, FinalStep) and step.status != "done":
        typer.echo(f"!! {step.status} ({step.reason})", err=True)


@app.command()
def chat(
    tools: list[Path] = TOOLS_OPT,
    mcp: list[str] = MCP_OPT,
    mcp_env: list[str] = MCP_ENV_OPT,
    mcp_header: list[str] = MCP_HEADER_OPT,
    user: str = typer.Option("default", "--user"),
    base_url: str | None = typer.Option(None, "--base-url"),
    model: str | None = typer.Option(None, "--model"),
    allow: list[str] = ALLOW_OPT,
    memory: bool = typer.Option(True, "--memory/--no-memory"),
    memory_tools: bool = MEMORY_TOOLS_OPT,
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Interactive chat; answers stream as they are written. Empty line or Ctrl-D quits."""
    _setup_logging(verbose)

    async def go() -> None:
        async with build_agent(
            tools=tools or [],
            mcp=mcp or [],
            mcp_env=mcp_env or [],
            mcp_headers=mcp_header or [],
            user=user,
            memory=memory,
            memory_tools=memory_tools,
            base_url=base_url,
            model=model,
            allow=allow,
            approve_dangerous=False,
            overrides={},
        ) as agent:
            agent.on_text = _write
            state: AgentState | None = None
            while True:
                line = await asyncio.to_thread(_read_line)
                if not line:
                    break
                state = state or AgentState(goal=line)
                sys.stdout.write("agent> ")
                async for step in agent.steps(line, state=state):
                    if isinstance(step, FinalStep) and not step.forced:
                        sys.stdout.write(step.answer)
                    elif not isinstance(step, FinalStep):
                        _echo_step(step)
                sys.stdout.write("\n")

    asyncio.run(go())


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _read_line() -> str:
    try:
        return input("you> ").strip()
    except EOFError:
        return ""


@trace_app.command("show")
def trace_show(run: str = typer.Argument(..., help="Run id (a prefix is enough) or path.")) -> None:
    """Print a run's timeline."""
    from loopstack.agent.observe.trace import show_trace

    try:
        show_trace(run)
    except FileNotFoundError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc


@app.command("explain")
def explain_cmd(
    run: str = typer.Argument(..., help="Trace file, or run id (a prefix is enough)."),
    as_json: bool = typer.Option(False, "--json", help="The start record(s) as JSON."),
) -> None:
    """What the run was given: its input, the memory block as injected, and which recalled
    records were kept or dropped, with each one's score and the reason."""
    from loopstack.agent.observe.explain import render
    from loopstack.agent.observe.trace import load_trace

    try:
        lines = load_trace(run)
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    if as_json:
        starts = [x for x in lines if x.get("type") == "start"]
        typer.echo(json.dumps(starts, ensure_ascii=False, indent=2))
    else:
        typer.echo(render(lines))


if __name__ == "__main__":
    app()
