"""Many app servers on one Postgres ledger: no duplicates, no cross-user rows, nothing lost.

Each app server is a real process (``memory_pg_app.py``) with its own FAISS replica folder,
all on one real PostgreSQL (the session's ``postgres`` fixture). Also: row-level security as
a boundary (a raw query under a wrong scope returns nothing), kill -9 of a server mid-write,
and a Postgres restart mid-run.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings, Scope
from loopstack.memory.ledger.postgres import PostgresLedger

APP = Path(__file__).with_name("memory_pg_app.py")
WRITES = 16  # per server: enough for duplicates and supersedes across servers, and fast
# how long a ledger request waits for a pooled connection before it fails (PostgresLedger's)
POOL_WAIT_S: float = inspect.signature(PostgresLedger).parameters["timeout_s"].default


def _spawn(url: str, replica: Path, seed: int, mode: str, n: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), url, str(replica), str(seed), mode, str(n)],
        stdin=subprocess.PIPE if mode == "verify" else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # not JSON: skipped by _rows, shown when a server fails
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    """The rest of the server's output, through the same buffered reader ``readline`` used
    (``communicate`` would read the pipe underneath and lose what that reader buffered)."""
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout)
    return out


def _rows(out: str) -> list[dict[str, Any]]:
    rows = []
    for line in out.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by kill -9 was never reported
    return rows


def _acks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "id" in r]


def _wait_ready(proc: subprocess.Popen[str], acks: int = 0) -> list[str]:
    """Read stdout lines until the server is ready and has acknowledged ``acks`` adds."""
    assert proc.stdout is not None
    lines, seen = [], 0
    while True:
        line = proc.stdout.readline()
        assert line, "".join(lines)[-3000:] or "app server died"
        lines.append(line)
        if '"ready"' in line and acks == 0:
            return lines
        seen += '"id"' in line
        if acks and seen >= acks:
            return lines


def _verify(url: str, replicas: list[Path], acks: list[dict[str, Any]]) -> None:
    """On every replica: each acknowledged add is in the ledger, and recallable if active.
    One process opens a server on each replica folder in turn (``memory_pg_app`` verify)."""
    data = "".join(json.dumps(a) + "\n" for a in acks)
    proc = _spawn(url, ",".join(str(r) for r in replicas), 900, "verify")
    out, _ = proc.communicate(data, timeout=240)
    assert proc.returncode == 0, out[-3000:]
    results = [r for r in _rows(out) if "checked" in r]
    assert len(results) == len(replicas), out[-3000:]
    for res in results:
        assert res["lost"] == [], f"acknowledged records lost: {res['lost']}"
        assert res["missing"] == [], f"not recallable on a replica: {res['missing']}"
        assert res["checked"] == len(acks)
        assert res["index_vectors"] == res["active"]


def _no_duplicates(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("SELECT set_config('loopstack.user_id', '*', false)")
        dups = conn.execute(
            "SELECT user_id, fingerprint, count(*) FROM records WHERE superseded_by IS NULL "
            "GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        assert dups == [], f"duplicate active facts: {dups}"
        statuses = conn.execute(
            "SELECT user_id, split_part(text, ' ', 2), count(*) FROM records WHERE "
            "superseded_by IS NULL AND text LIKE 'Project % status is %' GROUP BY 1, 2 "
            "HAVING count(*) > 1"
        ).fetchall()
        assert statuses == [], f"two active statuses of one project: {statuses}"


@pytest.mark.slow
@pytest.mark.parametrize("servers", [2, 4])
def test_servers_write_and_recall_concurrently(
    postgres: LocalPostgres, tmp_path: Path, servers: int
) -> None:
    url = postgres.new_schema()
    replicas = [tmp_path / f"replica{i}" for i in range(servers)]
    procs = [_spawn(url, replicas[i], i + 1, "write", WRITES) for i in range(servers)]
    rows: list[dict[str, Any]] = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
        rows += _rows(out)
    assert [r for r in rows if "error" in r] == []
    assert sum(r["xuser"] for r in rows if "xuser" in r) == 0, "another user's rows recalled"
    acks = _acks(rows)
    assert len(acks) == WRITES * servers
    _no_duplicates(url)
    _verify(url, replicas, acks)
    postgres.drop_schema(url)


@pytest.mark.slow
def test_kill_9_of_a_server_mid_write_loses_nothing(
    postgres: LocalPostgres, tmp_path: Path
) -> None:
    url = postgres.new_schema()
    replicas = [tmp_path / "a", tmp_path / "b"]
    procs = [_spawn(url, r, 11 + i, "write") for i, r in enumerate(replicas)]
    early = [_wait_ready(p, acks=6) for p in procs]
    time.sleep(0.3)
    os.kill(procs[0].pid, signal.SIGKILL)  # mid-write: it adds in a tight loop
    time.sleep(0.5)
    os.kill(procs[1].pid, signal.SIGKILL)
    acks: list[dict[str, Any]] = []
    for p, first in zip(procs, early, strict=True):
        out = _finish(p, timeout=30)
        assert p.returncode == -signal.SIGKILL
        acks += _acks(_rows("".join(first) + out))
    assert len(acks) >= 12
    _no_duplicates(url)
    _verify(url, replicas, acks)  # the killed servers' replicas reopen and catch up
    postgres.drop_schema(url)


class _Drain(threading.Thread):
    """Reads a server's stdout as it comes (so a full pipe never stalls the server while the
    test waits), keeping its rows; `wait` polls until a condition on them holds."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.lines: list[str] = []
        self.parsed: list[dict[str, Any]] = []
        self.start()

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)  # not JSON: shown when the server fails
            self.parsed += _rows(line)

    def rows(self) -> list[dict[str, Any]]:
        return list(self.parsed)

    def wait(self, ok: Callable[[list[dict[str, Any]]], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ok(self.rows()):
            assert time.monotonic() < deadline and self.is_alive(), "".join(self.lines[-5:])
            time.sleep(0.05)


@pytest.mark.slow
def test_postgres_restart_mid_run(postgres: LocalPostgres, tmp_path: Path) -> None:
    """Clear errors during the outage, no acknowledged write lost, replicas caught up. The
    servers write until stopped, so each is writing when Postgres goes away (with a fixed
    number of adds a fast box could finish them before the crash), their output read as it comes
    (a full pipe would hold a server out of the outage), and the outage outlasts a write's wait
    for a connection and its retry's (a server may ride out a shorter one without an error)."""
    url = postgres.new_schema()
    replicas = [tmp_path / "a", tmp_path / "b"]
    procs = [_spawn(url, r, 21 + i, "write") for i, r in enumerate(replicas)]  # forever
    drains = [_Drain(p) for p in procs]
    for d in drains:
        d.wait(lambda rows: len(_acks(rows)) >= 4)
    postgres.halt("immediate")  # a crash: no shutdown checkpoint
    time.sleep(2 * POOL_WAIT_S + 2)  # past a write's wait and its retry's
    postgres.resume()
    for d in drains:  # each server goes on: adds acknowledged after the outage
        before = len(_acks(d.rows()))
        d.wait(lambda rows, n=before: len(_acks(rows)) >= n + 4)
    for p, d in zip(procs, drains, strict=True):
        os.kill(p.pid, signal.SIGKILL)  # it was still writing: acknowledged adds must hold
        p.wait(30)
        d.join(30)
    rows = [r for d in drains for r in d.rows()]
    errors = [r["error"] for r in rows if "error" in r]
    assert errors, "the outage was not noticed"
    assert all(e.startswith("postgres ledger: ") for e in errors), errors[:3]
    acks = _acks(rows)
    assert len(acks) >= 16, [r for r in rows if "id" not in r]
    _no_duplicates(url)
    _verify(url, replicas, acks)  # the killed servers' replicas reopen and catch up
    postgres.drop_schema(url)


async def test_row_level_security_is_a_boundary(postgres: LocalPostgres, tmp_path: Path) -> None:
    url = postgres.new_schema()
    settings = MemorySettings(index_dir=tmp_path / "replica")
    st = AsyncMemoryStore(url, embedder=HashingEmbedder(), settings=settings)
    a = await st.add("Alice's bank PIN hint is the old street name", user_id="alice")
    await st.add("Bob keeps his bike in the basement", user_id="bob")
    assert (await st.stats())["rls"] is True  # the app role is bound by the policies
    alice = await st.get(a, user_id="alice")
    # The ledger's own scoped read, asked for Alice's row under Bob's scope: nothing.
    assert st.ledger.by_rowids([alice.rowid], Scope("bob")) == {}
    await st.close()
    with psycopg.connect(url) as conn:
        # No scope set at all: a raw query sees no one's memory.
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (0,)
        conn.rollback()
        # A wrong scope: a raw query for Alice's rows, by id and by user, returns nothing.
        conn.execute("SELECT set_config('loopstack.user_id', 'bob', true)")
        for sql in (
            "SELECT text FROM records WHERE user_id = 'alice'",
            f"SELECT text FROM records WHERE rowid = {alice.rowid}",
            f"SELECT vec FROM vectors WHERE rowid = {alice.rowid}",
            "SELECT * FROM user_terms WHERE user_id = 'alice'",
            "SELECT * FROM postings WHERE user_id = 'alice'",
            "SELECT * FROM changes WHERE user_id = 'alice'",
        ):
            assert conn.execute(sql).fetchall() == [], sql
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (1,)  # Bob's own
        # ... and cannot write into Alice's scope either.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE records SET user_id = 'alice'")
        conn.rollback()
        conn.execute("SELECT set_config('loopstack.user_id', 'alice', true)")
        rows = conn.execute("SELECT text FROM records").fetchall()
        assert rows == [("Alice's bank PIN hint is the old street name",)]
    postgres.drop_schema(url)
