"""One run of one client on its task, through the measuring proxy, judged by its checker.

The tasks (each run draws its own value, so no answer can be remembered or guessed):

- openai-chat, openai-responses, anthropic: a ``get_weather`` round trip, the tool answering
  "VALUE°C and foggy"; done when the final answer states VALUE (``checks.states_number``);
- agents: the Agents SDK with the same tool and ``output_type=WeatherReport``; done when the
  output validated and its ``temperature_c`` is VALUE;
- codex: ``apply_patch`` a new file with a line holding a random token, then say so; done
  when the file holds exactly that line and the last message says it is done;
- claude-code: read note.txt (a random token in it) and answer from it; done when the answer
  holds the token.

Each CLI works in the same folder in every run (emptied and made again), so the prompt of a
later run is the first run's, and the server's prefix cache can serve it."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from loopstack.bench.clients import ClientMissing, setup
from loopstack.bench.clients.checks import (
    Verdict,
    check_agents_output,
    check_claude,
    check_codex,
    check_weather_answer,
)
from loopstack.bench.clients.proxy import Exchange, MeasuringProxy

ClientName = Literal["openai-chat", "openai-responses", "anthropic", "agents", "codex",
                     "claude-code"]  # fmt: skip
CLIENTS: tuple[ClientName, ...] = ("openai-chat", "openai-responses", "anthropic", "agents",
                                   "codex", "claude-code")  # fmt: skip
SDK_CLIENTS = {"openai-chat", "openai-responses", "anthropic", "agents"}
SDK_SCRIPT = Path(__file__).with_name("sdk_tasks.py")
WORDS = ("KESTREL", "MARMOT", "QUARTZ", "LANTERN", "JUNIPER", "OSPREY", "TUNDRA", "PAPRIKA")
CODEX_FILE = "notes.txt"


@dataclass
class Target:
    """An endpoint under test: ``name`` (``loopstack``, ``baseline``), its ``…/v1`` URL."""

    name: str
    base_url: str
    api_key: str
    model: str


@dataclass
class Setup:
    """Where the clients are installed, where they work, how long a run may take."""

    python: Path
    npm_prefix: Path
    workdir: Path
    timeout_s: float
    # Claude Code drops a stream after 300 s without an event and retries (its own
    # CLAUDE_STREAM_IDLE_TIMEOUT_MS, 300 s at least); a CPU prefill of its first prompt can
    # take longer. None: Claude Code's default, as a user meets it.
    claude_idle_timeout_s: float | None = None
    codex_flags: tuple[str, ...] = ()  # more Codex flags, after the lean ones

    def binary(self, client: str) -> Path:
        path = (
            self.python
            if client in SDK_CLIENTS
            else self.npm_prefix / "bin" / ("codex" if client == "codex" else "claude")
        )
        if not path.exists():
            raise ClientMissing(client, str(path))
        return path


@dataclass
class RunRecord:
    """One run: the verdict, and what the proxy saw (turns = model requests)."""

    target: str
    client: str
    run: int
    done: bool
    why: str
    turns: int
    tool_calls: int
    first_token_s: float | None
    wall_s: float
    error: str | None = None
    # model requests that brought no output back: dropped by the client before the first
    # token (Claude Code's retries after its idle limit) or failed
    unanswered: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def draw_value(rng: random.Random) -> int:
    """A temperature a model would not say unprompted: 3-38 °C, never a multiple of 5."""
    return rng.choice([v for v in range(3, 39) if v % 5])


def draw_token(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"


def root_url(base_url: str) -> str:
    """A server's root from its ``…/v1`` URL (the Messages clients add ``/v1`` themselves)."""
    url = base_url.rstrip("/")
    return url.removesuffix("/v1")


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[int, str, str]:
    """A client process to its end (killed after ``timeout_s``): code, stdout, stderr."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return -9, out, f"timed out after {timeout_s:.0f} s\n{err}"
    return proc.returncode, out, err


def run_sdk(client: str, target: Target, proxy_root: str, setup_: Setup,
            rng: random.Random) -> tuple[Verdict, dict[str, Any]]:  # fmt: skip
    value = draw_value(rng)
    env = setup.clean_env()
    for key in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        env.pop(key, None)
    env |= {"OPENAI_BASE_URL": proxy_root + "/v1", "OPENAI_API_KEY": target.api_key,
            "ANTHROPIC_BASE_URL": proxy_root, "ANTHROPIC_API_KEY": target.api_key,
            "OPENAI_AGENTS_DISABLE_TRACING": "1"}  # fmt: skip
    argv = [str(setup_.binary(client)), str(SDK_SCRIPT), client, target.model, str(value)]
    code, out, err = _run(argv, env, setup_.workdir, setup_.timeout_s)
    try:
        report: dict[str, Any] = json.loads(out)
    except ValueError:
        report = {"error": f"exit {code}, no report: {err[-1500:]}"}
    report["value"] = value
    check = check_agents_output if client == "agents" else check_weather_answer
    return check(report, value), report


def run_codex(target: Target, proxy_root: str, setup_: Setup,
              rng: random.Random) -> tuple[Verdict, dict[str, Any]]:  # fmt: skip
    codex = setup_.binary("codex")
    base = setup_.workdir / target.name / "codex"
    home, repo = _fresh(base / "home"), _fresh(base / "repo")
    content = f"loopstack {draw_token(rng).lower()}"
    task = (f"Use apply_patch to create the file {CODEX_FILE} containing exactly this one "
            f"line: {content}\nThen tell me it is done.")  # fmt: skip
    setup.codex_home(home, proxy_root + "/v1", target.model)
    argv = setup.codex_argv(codex, repo, target.model, task, *setup_.codex_flags)
    code, out, err = _run(argv, setup.codex_env(home, target.api_key), repo, setup_.timeout_s)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    files = {p.name: p.read_text(errors="replace") for p in repo.iterdir() if p.is_file()}
    done = [e["item"] for e in events if e.get("type") == "item.completed"]
    report = {
        "rc": code,
        "content": content,
        "items": [i.get("type") for i in done],
        "commands": [i.get("command") for i in done if i.get("type") == "command_execution"],
        "file_changes": sum(1 for i in done if i.get("type") == "file_change"),
        "messages": [i.get("text", "")[:300] for i in done if i.get("type") == "agent_message"],
        "errors": [str(i.get("message"))[:300] for i in done if i.get("type") == "error"],
        "failed": [e for e in events if e.get("type") in ("turn.failed", "error")][:3],
        "files": {k: v[:200] for k, v in files.items()},
        "usage": next((e.get("usage") for e in events if e.get("type") == "turn.completed"),
                      None),
    }  # fmt: skip
    if code != 0:
        report["error"] = f"exit {code}: {err[-800:]}"
    return check_codex(events, files, CODEX_FILE, content), report


def run_claude(target: Target, proxy_root: str, setup_: Setup,
               rng: random.Random) -> tuple[Verdict, dict[str, Any]]:  # fmt: skip
    claude = setup_.binary("claude-code")
    base = setup_.workdir / target.name / "claude"
    home, project = _fresh(base / "home"), _fresh(base / "project")
    token = draw_token(rng)
    (project / "note.txt").write_text(f"The secret word is {token}.\n")
    env = setup.claude_env(home, proxy_root, target.api_key, target.model)
    if setup_.claude_idle_timeout_s:
        env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] = str(int(setup_.claude_idle_timeout_s * 1000))
    argv = setup.claude_argv(claude, "Read note.txt and tell me the secret word in it.")
    code, out, err = _run(argv, env, project, setup_.timeout_s)
    lines = out.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    report = {"rc": code, "token": token, **{k: result.get(k) for k in (
        "type", "subtype", "is_error", "result", "num_turns", "api_error_status",
        "duration_ms", "duration_api_ms", "usage")}}  # fmt: skip
    if not result:
        report["error"] = f"exit {code}, no result: {err[-800:] or out[-800:]}"
        return Verdict(False, "no result printed"), report
    return check_claude(result, token), report


def first_token(exchanges: list[Exchange]) -> float | None:
    """The first model request's first output: the run's first-token time."""
    model = [e for e in exchanges if e.model_request]
    return model[0].first_output_s if model else None


def keep_requests(folder: Path, stem: str, exchanges: list[Exchange]) -> None:
    """Each model request's body as the client sent it: FOLDER/STEM-N.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for n, ex in enumerate((e for e in exchanges if e.model_request), 1):
        (folder / f"{stem}-{n}.json").write_bytes(ex.request_body)


def run_once(client: str, target: Target, proxy: MeasuringProxy, proxy_root: str,
             setup_: Setup, run: int, rng: random.Random,
             keep: Path | None = None) -> RunRecord:  # fmt: skip
    """One run of ``client`` against ``target`` (reached through ``proxy``), judged; with
    ``keep``, the model requests' bodies are written there."""
    mark, started = proxy.mark(), time.monotonic()
    if client in SDK_CLIENTS:
        verdict, report = run_sdk(client, target, proxy_root, setup_, rng)
    elif client == "codex":
        verdict, report = run_codex(target, proxy_root, setup_, rng)
    else:
        verdict, report = run_claude(target, proxy_root, setup_, rng)
    wall = time.monotonic() - started
    exchanges = proxy.since(mark)
    model = [e for e in exchanges if e.model_request]
    failed = next((f"HTTP {e.status}: {e.error}" for e in model if e.error), None)
    if keep is not None:
        keep_requests(keep, f"{target.name}-{client}-{run}", exchanges)
    return RunRecord(
        target=target.name,
        client=client,
        run=run,
        done=verdict.done,
        why=verdict.why,
        turns=len(model),
        tool_calls=sum(e.tool_calls for e in model),
        first_token_s=first_token(exchanges),
        wall_s=round(wall, 2),
        error=(str(report["error"])[:1000] if report.get("error") else None) or failed,
        unanswered=sum(1 for e in model if e.first_output_s is None),
        requests=[e.summary() for e in model],
        detail=report,
    )
