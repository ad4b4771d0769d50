"""How each agent CLI is set up against a base URL, as a user configures it; the client bench
and the integration tests (tests/integration/test_codex.py, test_messages_clients.py) both
build their runs from these.

Codex CLI: a ``model_providers`` entry with ``wire_api = "responses"`` and
``model_catalog_url`` pointing at the server's GET /v1/models (Codex's catalogue shape:
``apply_patch`` as a free-form tool), plugins, apps, multi-agent, goals and web search off
(they reach for the internet; off, the first prompt is a third shorter), a temporary HOME
and CODEX_HOME, ``codex exec --json`` on one task.

Claude Code: ``ANTHROPIC_BASE_URL`` (no ``/v1``: it adds it), the key as a Bearer token,
every model slot (main, haiku/sonnet/opus, sub-agents) set to the served name, the
non-essential traffic off, a temporary HOME, ``claude -p TASK --output-format json``."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# The clients' own installs, relative to the repository root (`make clients`, `make
# npm-clients`); the bench takes others by option or environment.
CLIENTS_VENV = ROOT / ".venv-clients"
NPM_PREFIX = ROOT / ".npm-clients"

CODEX_VERSION = "0.169.0"  # requirements/npm-clients.txt
# What keeps Codex off the internet (and its first prompt a third shorter).
CODEX_LEAN = ["--disable", "plugins", "--disable", "apps", "--disable", "multi_agent",
              "--disable", "goals", "-c", 'web_search="disabled"']  # fmt: skip
CLAUDE_QUIET = {  # Claude Code reaches for the internet unless told not to
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def clean_env() -> dict[str, str]:
    """This process's environment without what would leak our own venv into a client's."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def codex_config_toml(base_url: str, model: str) -> str:
    """``$CODEX_HOME/config.toml`` for a server at ``base_url`` (``…/v1``)."""
    return f"""model = "{model}"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.local]
name = "local"
base_url = "{base_url}"
model_catalog_url = "{base_url}/models"
env_key = "LOCAL_API_KEY"
wire_api = "responses"
stream_idle_timeout_ms = 900000
supports_websockets = false

[analytics]
enabled = false
"""


def codex_home(home: Path, base_url: str, model: str) -> None:
    """Make ``home`` a Codex HOME (and CODEX_HOME) for the server at ``base_url``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(codex_config_toml(base_url, model))


def codex_env(home: Path, key: str) -> dict[str, str]:
    env = clean_env()
    env |= {"HOME": str(home), "CODEX_HOME": str(home), "LOCAL_API_KEY": key, "NO_COLOR": "1"}
    return env


def codex_argv(codex: Path, repo: Path, model: str, task: str, *extra: str) -> list[str]:
    """``extra``: more of Codex's flags (``--disable view_image``), before the task."""
    return [str(codex), "exec", "--json", "--ephemeral", "--color", "never",
            "--skip-git-repo-check", *CODEX_LEAN, *extra, "-C", str(repo), "-m", model,
            task]  # fmt: skip


def claude_env(home: Path, base_url: str, key: str, model: str) -> dict[str, str]:
    """Claude Code's environment for the server at ``base_url`` (its root, no ``/v1``)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))},
        **CLAUDE_QUIET,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,  # no /v1: Claude Code adds it
        "ANTHROPIC_AUTH_TOKEN": key,  # sent as Authorization: Bearer
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
    }


def claude_argv(claude: Path, task: str, *extra: str) -> list[str]:
    return [str(claude), "-p", task, "--output-format", "json", "--allowedTools", "Read",
            "--max-turns", "4", *extra]  # fmt: skip
