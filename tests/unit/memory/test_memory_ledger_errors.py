"""The SQLite ledger's busy and locked errors are types of their own, chosen by SQLite's result
code (``sqlite_errorcode``), never by the text of the message."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from loopstack.memory.exceptions import (
    LedgerBusyError,
    LedgerError,
    LedgerLockedError,
    LoopstackMemoryError,
)
from loopstack.memory.ledger.sqlite import SqliteLedger, ledger_error


def _busy(path: Path) -> sqlite3.OperationalError:
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("CREATE TABLE IF NOT EXISTS t(x)")
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("BEGIN IMMEDIATE")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        other.close()
    return caught.value


def _locked() -> sqlite3.OperationalError:
    uri = "file:ledger-errors?mode=memory&cache=shared"
    holder = sqlite3.connect(uri, uri=True, isolation_level=None)
    other = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=0)
    holder.execute("CREATE TABLE t(x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("SELECT * FROM t").fetchall()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        other.close()
    return caught.value


def test_busy_and_locked_are_typed_by_result_code(tmp_path: Path) -> None:
    busy, locked = _busy(tmp_path / "x.db"), _locked()
    assert busy.sqlite_errorcode == sqlite3.SQLITE_BUSY
    assert locked.sqlite_errorcode & 0xFF == sqlite3.SQLITE_LOCKED  # SQLITE_LOCKED_SHAREDCACHE
    assert type(ledger_error(busy)) is LedgerBusyError
    assert type(ledger_error(locked)) is LedgerLockedError
    for err in (ledger_error(busy), ledger_error(locked)):
        assert isinstance(err, LedgerError) and isinstance(err, LoopstackMemoryError)


def test_the_type_follows_the_code_not_the_message() -> None:
    """A message that says "locked" with another code is a plain ledger error; a busy code
    with a message that does not say it is still busy."""
    says_locked = sqlite3.OperationalError("no such table: locked")
    says_locked.sqlite_errorcode = sqlite3.SQLITE_ERROR  # type: ignore[attr-defined]
    quiet_busy = sqlite3.OperationalError("snapshot is stale")
    quiet_busy.sqlite_errorcode = 517  # type: ignore[attr-defined]  # SQLITE_BUSY_SNAPSHOT
    assert type(ledger_error(says_locked)) is LedgerError
    assert type(ledger_error(quiet_busy)) is LedgerBusyError
    assert str(ledger_error(quiet_busy, "cannot start a write: ")) == (
        "cannot start a write: snapshot is stale"
    )


def test_a_write_while_another_process_writes_is_a_busy_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    ledger._writer.execute("PRAGMA busy_timeout=0")  # fail at once instead of in 30 s
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LedgerBusyError, match="cannot start a write"):
            with ledger.write():
                pass
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with ledger.write():  # the lock was released: the next write goes through
        pass
    ledger.close()
