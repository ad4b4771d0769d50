"""The benchmarks' command lines: one parser system (typer) for ``loopstack bench`` and for each
benchmark module run on its own (``python -m loopstack.bench.memory.latency``).

Each benchmark module declares its options as a typer app (``app``) and keeps
``main(argv=None) -> int``: ``run_command(app, argv)`` runs it, or ``parse_command(app, argv)``
returns what its command builds (the options, for the benchmarks whose ``run`` is a coroutine a
test awaits). ``loopstack bench SUBJECT NAME ...`` imports the module only when its command runs
and hands it the rest of the line as ``argv``, with :data:`PROG` set to the name in its usage
line; nobody assigns ``sys.argv``.

As with the parsers these replace, an option that takes several values takes them one after the
other (``--sizes 10000 100000``), and ``--sizes 10000 --sizes 100000`` works too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import typer

__all__ = ["PROG", "benchmark_app", "parse_command", "run_command"]

#: The program name in a benchmark's usage line: ``loopstack bench SUBJECT NAME`` when the
#: ``loopstack bench`` command runs it; unset (the script's own name) otherwise.
PROG: ContextVar[str | None] = ContextVar("PROG", default=None)

_NUMBER = re.compile(r"-\d")


def benchmark_app(help: str | None) -> typer.Typer:
    """A benchmark module's app: its commands' help, no shell-completion options."""
    return typer.Typer(
        help=help, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None
    )


def parse_command(app: typer.Typer, argv: Sequence[str] | None = None) -> Any:
    """What the app's command returns for ``argv`` (default: this process's arguments). Like
    argparse: ``--help`` prints the help and exits 0, a usage error prints it and exits 2."""
    out = _invoke(app, argv)
    if isinstance(out, int):  # --help, or a usage error: already printed
        raise SystemExit(out)
    return out


def run_command(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run the app's command on ``argv`` (default: this process's arguments); its exit status:
    what the command returns (an int; 0 for anything else), 0 after ``--help``, 2 after a
    usage error (printed)."""
    out = _invoke(app, argv)
    return out if isinstance(out, int) else 0


def _invoke(app: typer.Typer, argv: Sequence[str] | None) -> Any:
    command = typer.main.get_command(app)
    if not command.help and isinstance(app.info.help, str):  # one command: the app's help
        command.help = app.info.help
    args = list(sys.argv[1:] if argv is None else argv)
    multiple = {
        name
        for param in command.params
        if getattr(param, "multiple", False)
        for name in getattr(param, "opts", ())
    }
    for sub in getattr(command, "commands", {}).values():  # an app of several commands
        multiple |= {n for p in sub.params if getattr(p, "multiple", False) for n in p.opts}
    try:
        return command.main(
            args=_spread(args, multiple), prog_name=PROG.get(), standalone_mode=False
        )
    except typer.TyperException as exc:  # a usage error: what argparse printed, exit 2
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        return int(getattr(exc, "exit_code", 2))


def _spread(args: list[str], multiple: set[str]) -> list[str]:
    """``--opt a b c`` as ``--opt a --opt b --opt c`` for each option in ``multiple`` (the
    values end at the next option, as argparse's ``nargs="+"`` ended them)."""
    out: list[str] = []
    current: str | None = None
    taken = 0
    for arg in args:
        if arg == "--":
            current = None
        elif arg.startswith("-") and not _NUMBER.match(arg):
            current, taken = (arg, 0) if arg in multiple else (None, 0)
        elif current is not None:
            if taken:
                out.append(current)
            taken += 1
        out.append(arg)
    return out
