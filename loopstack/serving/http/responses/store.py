"""Stored responses: what ``store`` keeps, ``previous_response_id`` reads and
``GET``/``DELETE /v1/responses/{id}`` show.

One table, ``loopstack_responses`` (id, owner, created_at, body): the body holds the
Response object as answered and the chain's history (every input item of the chain, then
this response's output), so a chain is rebuilt from its last response alone, even once
older ones have aged out. A SQLite file under the server home by default
(``LOOPSTACK_HOME/responses.sqlite3``: durable across a restart, shared by processes on one
machine); PostgreSQL (psycopg 3) when ``LOOPSTACK_RESPONSES_DB`` is a ``postgresql://`` URL,
so replicas behind a router share one chain. Each row belongs to the hash of the API key
that made it (`owner_of`); another key sees nothing. Bounded: rows older than
``LOOPSTACK_RESPONSES_MAX_AGE_S`` and beyond ``LOOPSTACK_RESPONSES_MAX_ITEMS`` (oldest
first) are deleted as new ones are written, and a body over
``LOOPSTACK_RESPONSES_MAX_BYTES`` is not stored (said in the log).

The database calls are blocking and short; they run in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

TABLE = "loopstack_responses"
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "created_at DOUBLE PRECISION NOT NULL, body TEXT NOT NULL)"
)
_INDEX = f"CREATE INDEX IF NOT EXISTS {TABLE}_created ON {TABLE} (created_at)"


def owner_of(api_key: str | None) -> str:
    """Whose rows a request sees: the SHA-256 of its bearer key (``""`` without one)."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


@dataclass(frozen=True)
class StoreLimits:
    max_items: int = 10_000
    max_age_s: float = 30 * 86_400.0
    max_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]
    history: list[dict[str, Any]]  # the chain's input items and this response's output


class ResponseStore(Protocol):
    async def put(self, owner: str, stored: Stored) -> None: ...
    async def get(self, owner: str, id_: str) -> Stored | None: ...
    async def delete(self, owner: str, id_: str) -> bool: ...
    def close(self) -> None: ...


class _SqlStore:
    """What the SQLite and Postgres stores share: the statements, the bounds."""

    placeholder = "?"

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits

    def _sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    def _run(self, sql: str, params: tuple[Any, ...] = (), *, fetch: bool = False) -> Any:
        raise NotImplementedError

    def _put(self, owner: str, stored: Stored) -> None:
        body = json.dumps(
            {"response": stored.response, "history": stored.history}, ensure_ascii=False
        )
        if len(body) > self.limits.max_bytes:
            logger.warning(
                "response %s not stored: %d bytes (LOOPSTACK_RESPONSES_MAX_BYTES)",
                stored.response.get("id"),
                len(body),
            )
            return
        now = time.time()
        self._run(
            f"INSERT INTO {TABLE} (id, owner, created_at, body) VALUES (?, ?, ?, ?)",
            (stored.response["id"], owner, now, body),
        )
        self._run(f"DELETE FROM {TABLE} WHERE created_at < ?", (now - self.limits.max_age_s,))
        self._run(
            f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} "
            "ORDER BY created_at DESC LIMIT -1 OFFSET ?)"
            if self.placeholder == "?"
            else f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} "
            "ORDER BY created_at DESC OFFSET ?)",
            (self.limits.max_items,),
        )

    def _get(self, owner: str, id_: str) -> Stored | None:
        cutoff = time.time() - self.limits.max_age_s
        rows = self._run(
            f"SELECT body FROM {TABLE} WHERE id = ? AND owner = ? AND created_at >= ?",
            (id_, owner, cutoff),
            fetch=True,
        )
        if not rows:
            return None
        data = json.loads(rows[0][0])
        return Stored(data["response"], data["history"])

    def _delete(self, owner: str, id_: str) -> bool:
        n = self._run(f"DELETE FROM {TABLE} WHERE id = ? AND owner = ?", (id_, owner))
        return bool(n)

    async def put(self, owner: str, stored: Stored) -> None:
        await asyncio.to_thread(self._put, owner, stored)

    async def get(self, owner: str, id_: str) -> Stored | None:
        return await asyncio.to_thread(self._get, owner, id_)

    async def delete(self, owner: str, id_: str) -> bool:
        return await asyncio.to_thread(self._delete, owner, id_)


class SqliteStore(_SqlStore):
    """One SQLite file (WAL), one connection per store, calls serialised by a lock."""

    def __init__(self, path: str | Path, limits: StoreLimits | None = None) -> None:
        super().__init__(limits or StoreLimits())
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(path), check_same_thread=False, timeout=30.0, isolation_level=None
        )
        if str(path) != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.execute(_INDEX)

    def _run(self, sql: str, params: tuple[Any, ...] = (), *, fetch: bool = False) -> Any:
        with self._lock:
            cur = self._db.execute(sql, params)
            return cur.fetchall() if fetch else cur.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresStore(_SqlStore):
    """PostgreSQL through psycopg 3: a connection per call (replicas share the database)."""

    placeholder = "%s"

    def __init__(self, url: str, limits: StoreLimits | None = None) -> None:
        super().__init__(limits or StoreLimits())
        import psycopg  # only where a Postgres store is configured

        self._psycopg = psycopg
        self.url = url
        self._run(_SCHEMA)
        self._run(_INDEX)

    def _run(self, sql: str, params: tuple[Any, ...] = (), *, fetch: bool = False) -> Any:
        with self._psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(self._sql(sql), params)  # type: ignore[call-overload]
            return cur.fetchall() if fetch else cur.rowcount

    def close(self) -> None:
        return None


def open_store(url: str | None, home: Path, limits: StoreLimits | None = None) -> ResponseStore:
    """The store `LOOPSTACK_RESPONSES_DB` names: a Postgres URL, a SQLite path, or (unset)
    ``home/responses.sqlite3``."""
    if url and url.startswith(("postgres://", "postgresql://")):
        return PostgresStore(url, limits)
    path = Path(url.removeprefix("sqlite:///")) if url else home / "responses.sqlite3"
    return SqliteStore(path, limits)
