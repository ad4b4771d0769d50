"""``loopstack bench clients``: every real agent client on its small task, N runs each,
against an endpoint (and a baseline endpoint beside it, the anchor).

    loopstack bench clients --base-url http://127.0.0.1:8000/v1 --runs 5 \\
        [--clients openai-chat,anthropic,agents,codex,claude-code] \\
        [--baseline-url http://127.0.0.1:8001/v1] [--out bench/results/clients]

The runs go client by client; for each client, every target's N runs in turn (so a drift of
the machine's load touches both targets alike). OUT/result.json and OUT/results.md are
written again after every run."""

from __future__ import annotations

import datetime as dt
import os
import random
import shlex
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import typer

from loopstack.bench.clients import ClientBenchError, setup
from loopstack.bench.common import DEFAULT_BASE_URL, api_key_or_env

# The clients by name (runs.CLIENTS, checked by a unit test): written here so that `loopstack
# bench --help` does not import the proxy's server stack.
CLIENTS = ("openai-chat", "openai-responses", "anthropic", "agents", "codex", "claude-code")


def resolve_model(base_url: str, api_key: str, model: str | None) -> str:
    """``model``, or the first one the endpoint lists."""
    import httpx

    if model:
        return model
    try:
        r = httpx.get(
            base_url.rstrip("/") + "/models",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ClientBenchError(f"cannot list the models of {base_url}: {exc}") from exc


def parse_clients(text: str) -> list[str]:
    wanted = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CLIENTS]
    if unknown or not wanted:
        raise typer.BadParameter(f"clients are among {', '.join(CLIENTS)}: got {text!r}")
    return wanted


def clients(
    base_url: str = typer.Option(DEFAULT_BASE_URL, help="The endpoint under test (…/v1)."),
    runs: int = typer.Option(5, min=1, help="Runs per client and target."),
    clients: str = typer.Option(",".join(CLIENTS), help="Comma-separated subset of clients."),
    out: Path = typer.Option(Path("bench/results/clients"), help="Output directory."),
    api_key: str | None = typer.Option(None, help="API key (default: $LOOPSTACK_API_KEY)."),
    model: str | None = typer.Option(None, help="Model (default: first of /v1/models)."),
    baseline_url: str | None = typer.Option(
        None, help="A second endpoint (e.g. raw vLLM with the same model), run beside."
    ),
    baseline_api_key: str | None = typer.Option(None, help="Key for --baseline-url."),
    baseline_model: str | None = typer.Option(None, help="Model at --baseline-url."),
    clients_venv: Path | None = typer.Option(
        None, help="The SDKs' venv (default: $LOOPSTACK_CLIENTS_VENV or .venv-clients)."
    ),
    npm_prefix: Path | None = typer.Option(
        None, help="The CLIs' npm prefix (default: $LOOPSTACK_NPM_CLIENTS or .npm-clients)."
    ),
    timeout_s: float = typer.Option(1200.0, help="A run is killed after this long."),
    claude_idle_timeout_s: float | None = typer.Option(
        None,
        help="Claude Code's stream idle limit (CLAUDE_STREAM_IDLE_TIMEOUT_MS; its default "
        "300 s, which a CPU prefill of its first prompt can exceed: it then retries).",
    ),
    codex_flags: str = typer.Option(
        "",
        help="More Codex flags after the lean ones, shell-quoted (e.g. '--disable view_image"
        " --enable omit_skill_descriptions').",
    ),
    keep_requests: bool = typer.Option(
        False, help="Write every model request's body under OUT/requests/."
    ),
    seed: int | None = typer.Option(None, help="Seed of the drawn values (default: fresh)."),
) -> None:
    """Each real agent client (SDKs, Agents SDK, Codex, Claude Code) on a small real task."""
    from loopstack.bench.clients.proxy import running_proxy
    from loopstack.bench.clients.report import print_summary, run_line, summarise, write_outputs
    from loopstack.bench.clients.runs import RunRecord, Setup, Target, root_url, run_once

    wanted = parse_clients(clients)
    venv = clients_venv or Path(os.environ.get("LOOPSTACK_CLIENTS_VENV", setup.CLIENTS_VENV))
    prefix = npm_prefix or Path(os.environ.get("LOOPSTACK_NPM_CLIENTS", setup.NPM_PREFIX))
    try:
        targets = [Target("loopstack", base_url, api_key_or_env(api_key), "")]
        if baseline_url:
            targets.append(Target("baseline", baseline_url, baseline_api_key or "EMPTY", ""))
        for t, m in zip(targets, [model, baseline_model], strict=False):
            t.model = resolve_model(t.base_url, t.api_key, m)
    except ClientBenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    rng = random.Random(seed)
    meta = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["loopstack", "bench", *sys.argv[sys.argv.index("clients") :]])
        if "clients" in sys.argv
        else "loopstack bench clients",
        "runs_per_client": runs,
        "clients": wanted,
        "targets": [{"name": t.name, "base_url": t.base_url, "model": t.model} for t in targets],
        "seed": seed,
        "claude_idle_timeout_s": claude_idle_timeout_s,
        "codex_flags": codex_flags,
    }
    records: list[RunRecord] = []
    keep = out / "requests" if keep_requests else None
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loopstack-cb-")))
        run_setup = Setup(
            venv / "bin" / "python",
            prefix,
            workdir,
            timeout_s,
            claude_idle_timeout_s,
            tuple(shlex.split(codex_flags)),
        )
        proxies = [stack.enter_context(running_proxy(root_url(t.base_url))) for t in targets]
        for client in wanted:
            for target, (proxy, proxy_root) in zip(targets, proxies, strict=True):
                for n in range(1, runs + 1):
                    try:
                        record = run_once(client, target, proxy, proxy_root, run_setup, n, rng,
                                          keep)  # fmt: skip
                    except ClientBenchError as exc:
                        typer.echo(f"error: {exc}", err=True)
                        raise typer.Exit(2) from exc
                    records.append(record)
                    typer.echo(run_line(record))
                    write_outputs(out, meta, records)
    paths = write_outputs(out, meta, records)
    print_summary(summarise(records))
    for p in paths:
        typer.echo(f"wrote {p}")
