"""A throwaway local PostgreSQL server, for the tests and benchmarks of the Postgres ledger
(``tests/unit/memory``, ``loopstack.bench.memory.postgres``); no product command uses it.

``LocalPostgres`` runs ``initdb`` in a temporary folder, starts the server on a free port
(TCP on 127.0.0.1 plus a Unix socket in the folder), creates an ordinary login role
``loopstack`` (no superuser, no BYPASSRLS: row-level security binds it) and hands out fresh
databases owned by it. ``stop()`` stops the server and removes the folder. The server
binaries come from ``pg_config --bindir`` (Debian ``postgresql-15``) or ``PG_BINDIR``.
``initdb`` refuses to run as root: as root, every server command runs as the ``postgres``
system user (``runuser``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

__all__ = ["APP_ROLE", "LocalPostgres", "pg_bindir"]

APP_ROLE = "loopstack"


def pg_bindir() -> Path:
    """The folder holding initdb and pg_ctl; raises RuntimeError when there is none."""
    env = os.environ.get("PG_BINDIR")
    candidates = [Path(env)] if env else []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise RuntimeError(
        "PostgreSQL server binaries not found (initdb, pg_ctl): install the Debian package "
        "postgresql-15 (make test does) or set PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """``with LocalPostgres() as pg: url = pg.new_database()``."""

    def __init__(self, *, fsync: bool = True) -> None:
        self.fsync = fsync  # off only loses data on an OS crash, not a server crash
        self.bindir = pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="loopstack-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_root = os.geteuid() == 0
        self._names = itertools.count(1)
        self._dbs: set[str] = set()
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o700)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        return f"postgresql://{APP_ROLE}@127.0.0.1:{self.port}/{db}"

    def start(self) -> LocalPostgres:
        if not (self.data / "PG_VERSION").exists():
            no_sync = [] if self.fsync else ["--no-sync"]  # like the server's fsync=off
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                *no_sync,
            )
        self.resume()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER NOBYPASSRLS")
        return self

    def resume(self) -> None:
        """Start (or restart) the server on the same port and data."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.fsync:
            opts += " -c fsync=off -c full_page_writes=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start"
        )

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def new_database(self, name: str | None = None) -> str:
        """A fresh database owned by the app role; returns its URL."""
        db = name or f"mem{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db} OWNER {APP_ROLE} STRATEGY FILE_COPY")
        return self.url(db)

    def new_schema(self, db: str = APP_ROLE) -> str:
        """A fresh schema in database ``db`` (created once), owned by the app role; returns a
        URL whose ``search_path`` is that schema. Much cheaper than a database per test."""
        if db not in self._dbs:
            self.new_database(db)
            self._dbs.add(db)
        name = f"s{next(self._names)}"
        with psycopg.connect(self.url(db), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return f"{self.url(db)}?options=-csearch_path%3D{name}"

    def drop_schema(self, url: str) -> None:
        db, _, name = url.rsplit("/", 1)[1].partition("?options=-csearch_path%3D")
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.url(db), autocommit=True) as conn,
        ):
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
