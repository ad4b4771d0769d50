"""How a run ends for the shell and for a person: its exit code, and the hand-off of a run that
did not finish.

Exit codes of ``loopstack agent run`` (one per status; scripts can tell them apart)::

    0  done        an answer was produced (the model's own, or one forced after a repeat)
    2  -           bad settings, tools file or arguments (nothing ran; also typer's usage errors)
    3  max_steps   a step or tool-call limit, or no progress: the answer is best-effort
    4  budget      the token budget or the wall clock ran out: answered from the observations
    5  error       the model endpoint failed
    6  refused     the run stopped on a call it may not make (not allowed, or denied)

A run that does not end ``done`` can be handed to a person: ``--on-unfinished CMD`` runs CMD
(split like a shell line, no shell) with the run's summary JSON (the ``--json`` object) on its
stdin; ``--handoff-url URL`` POSTs the same JSON to a webhook, which must be on this machine
(localhost, 127.0.0.0/8, ::1): the summary holds the goal's answer and tool calls, and is
not sent elsewhere. A hook that fails is logged; it never changes the exit code.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from loopstack.agent.core.state import Status
from loopstack.agent.exceptions import ConfigError

__all__ = ["CONFIG_ERROR", "EXIT_CODES", "Handoff", "exit_code", "local_url"]

logger = logging.getLogger(__name__)

CONFIG_ERROR = 2
EXIT_CODES: dict[Status, int] = {
    "done": 0,
    "max_steps": 3,
    "budget": 4,
    "error": 5,
    "refused": 6,
}
HOOK_TIMEOUT_S = 30.0


def exit_code(status: str) -> int:
    """The process exit code of a run that ended with ``status`` (see the table above)."""
    return EXIT_CODES.get(status, EXIT_CODES["error"])  # type: ignore[call-overload]


def local_url(url: str) -> str:
    """``url`` when it is http(s) to this machine, else a ConfigError."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"--handoff-url {url!r}: an http(s) URL is needed")
    if host == "localhost":
        return url
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        raise ConfigError(f"--handoff-url {url!r}: only localhost / 127.0.0.1 / ::1 are allowed")
    return url


@dataclass(frozen=True)
class Handoff:
    """Where an unfinished run goes: a command, a local webhook, or both."""

    command: str | None = None
    url: str | None = None
    timeout_s: float = HOOK_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.url is not None:
            local_url(self.url)
        if self.command is not None:
            try:
                if not shlex.split(self.command):
                    raise ConfigError("--on-unfinished: empty command")
            except ValueError as exc:
                raise ConfigError(f"--on-unfinished {self.command!r}: {exc}") from exc

    def wanted(self, status: str) -> bool:
        return status != "done" and (self.command is not None or self.url is not None)

    async def __call__(self, summary: dict[str, Any]) -> list[str]:
        """Hand the run over when it did not finish; returns what failed (already logged)."""
        if not self.wanted(str(summary.get("status"))):
            return []
        body = json.dumps(summary, ensure_ascii=False, default=str).encode()
        problems = []
        if self.command is not None:
            problems += await self._run(body)
        if self.url is not None:
            problems += await self._post(body)
        for p in problems:
            logger.warning("hand-off: %s", p)
        return problems

    async def _run(self, body: bytes) -> list[str]:
        assert self.command is not None
        argv = shlex.split(self.command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return [f"--on-unfinished {argv[0]!r} could not start: {exc}"]
        try:
            _, err = await asyncio.wait_for(proc.communicate(body), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return [f"--on-unfinished {argv[0]!r} ran past {self.timeout_s:g} s: killed"]
        if proc.returncode:
            tail = err.decode(errors="replace").strip()[-300:]
            return [f"--on-unfinished {argv[0]!r} exited {proc.returncode}: {tail}"]
        return []

    async def _post(self, body: bytes) -> list[str]:
        import httpx

        assert self.url is not None
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:
                resp = await client.post(
                    self.url, content=body, headers={"content-type": "application/json"}
                )
        except httpx.HTTPError as exc:
            return [f"--handoff-url: {type(exc).__name__}: {exc}"]
        if resp.status_code >= 400:
            return [f"--handoff-url answered {resp.status_code}"]
        return []
