"""The client-task bench (`loopstack bench clients`): each real agent client on a small real
task against any endpoint, N runs each, judged by a strict checker.

The clients run as their real selves: the openai SDK, the anthropic SDK and the Agents SDK
from their own venv (``.venv-clients``, `make clients`) as a subprocess script
(``sdk_tasks``), Codex CLI and Claude Code from their npm prefix (``.npm-clients``,
`make npm-clients`). Every model request goes through a measuring proxy in this process
(``proxy``), which counts the turns and the tool calls the model made and times the first
token of each answer, the same way for every client and every API. Modules, by noun:

- ``checks``   the strict checkers: did the run do the task (pure functions)
- ``setup``    how each CLI is configured against a base URL (shared with the tests)
- ``proxy``    the measuring pass-through proxy and its SSE reading
- ``runs``     the tasks: one run of one client, its record
- ``report``   aggregation per client, the JSON and Markdown outputs, the printed table
- ``command``  the typer command, registered by ``loopstack.bench.cli``
- ``sdk_tasks`` the script run in the clients venv (imports only the clients' packages)

Exceptions: ``ClientBenchError`` is the root; ``ClientMissing`` (a client's venv or binary
is not installed) derives from it.
"""

from __future__ import annotations


class ClientBenchError(Exception):
    """Root of the client-bench exceptions.

    ClientBenchError
    └── ClientMissing   a client's python or CLI binary is not where it was looked for
    """


class ClientMissing(ClientBenchError):
    def __init__(self, client: str, path: str) -> None:
        super().__init__(f"{client}: {path} not found (make clients / make npm-clients)")
        self.client = client
        self.path = path
