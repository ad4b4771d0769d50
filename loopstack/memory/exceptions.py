"""Exceptions raised by the ``memory`` package.

Every exception the package raises on purpose derives from one root, so callers can
catch memory failures without catching everything else::

    LoopstackMemoryError
    ├── ConfigError                  bad settings (unknown index kind, bad weights, ...)
    ├── LedgerError                  the ledger (SQLite or Postgres) failed or is not what we expect
    │   ├── LedgerBusyError          SQLite: another connection holds the lock (SQLITE_BUSY)
    │   ├── LedgerLockedError        SQLite: a table is locked inside this process (SQLITE_LOCKED)
    │   ├── SchemaVersionError       the ledger was written by a newer schema
    │   └── RowSecurityError         Postgres: the role bypasses row-level security
    ├── IndexError_                  the FAISS index is unusable
    │   └── IndexMismatchError       index dim/model differs from the ledger's embedder
    ├── EmbeddingError               the embedder failed (model missing, endpoint down)
    ├── NotFoundError                no record with this id (for this user)
    ├── ScopeError                   a call without a user scope, or across users
    ├── RejectedError                the write-back gate refused a record
    │   └── RedactedError            the text was (almost) only a secret
    └── ModelError                   the optional model endpoint failed or answered badly
        └── SchemaViolationError     its JSON did not match the fixed schema

``IndexError_`` has a trailing underscore so it does not shadow the builtin ``IndexError``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EmbeddingError",
    "IndexError_",
    "IndexMismatchError",
    "LedgerBusyError",
    "LedgerError",
    "LedgerLockedError",
    "LoopstackMemoryError",
    "ModelError",
    "NotFoundError",
    "RedactedError",
    "RejectedError",
    "RowSecurityError",
    "SchemaVersionError",
    "SchemaViolationError",
    "ScopeError",
]


class LoopstackMemoryError(Exception):
    """Root of every error raised on purpose by :mod:`memory`."""


class ConfigError(LoopstackMemoryError):
    """Settings that cannot work together."""


class LedgerError(LoopstackMemoryError):
    """The ledger (a SQLite file or a Postgres database) failed or holds something
    unexpected."""


class LedgerBusyError(LedgerError):
    """SQLite answered ``SQLITE_BUSY`` ("database is locked"): another connection, often
    another process, holds the file's lock past the busy timeout."""


class LedgerLockedError(LedgerError):
    """SQLite answered ``SQLITE_LOCKED`` ("database table is locked"): a conflict between
    connections of one process (shared cache) or inside one connection."""


class SchemaVersionError(LedgerError):
    """The ledger (SQLite file or Postgres database) was written by a newer, unknown schema
    version."""


class RowSecurityError(LedgerError):
    """The Postgres ledger's role is a superuser or has BYPASSRLS: the per-user row-level
    security would not apply, so the ledger refuses to open (unless explicitly allowed)."""


class IndexError_(LoopstackMemoryError):
    """The FAISS index is unusable (corrupt file, wrong kind)."""


class IndexMismatchError(IndexError_):
    """The persisted index was built by another embedder (dimension or model name)."""


class EmbeddingError(LoopstackMemoryError):
    """The embedder could not produce vectors."""


class NotFoundError(LoopstackMemoryError):
    """No record with this id is visible to the caller."""


class ScopeError(LoopstackMemoryError):
    """A call that lacks a user scope, or that crosses users."""


class RejectedError(LoopstackMemoryError):
    """The write-back gate refused to store a record."""


class RedactedError(RejectedError):
    """After removing secrets, nothing worth storing was left."""


class ModelError(LoopstackMemoryError):
    """The optional OpenAI-compatible model endpoint failed."""


class SchemaViolationError(ModelError):
    """The model's JSON did not validate against the fixed schema."""
