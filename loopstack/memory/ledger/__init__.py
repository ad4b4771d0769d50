"""The ledger: the source of truth of every memory, on SQLite or on Postgres.

::

    loopstack/memory/ledger/
    ├── backend.py          the seam (LedgerBackend, LedgerTx) and open_ledger(path | URL)
    ├── schema.py           the tables of both, declared once (rendered through a Dialect)
    ├── common.py           what both share: rows, record mapping, the SQL that reads the same
    ├── sqlite.py           SqliteLedger: one SQLite file (WAL, FTS5), the embedded default
    ├── postgres.py         PostgresLedger: one database shared by many app servers
    ├── postgres_tx.py      its writing transactions (advisory lock, ordered change log)
    └── postgres_schema.py  its own schema parts, versioned migrations, row-level security

``open_ledger`` picks one from a location: a path, or a ``postgresql://`` URL (psycopg is
imported only then).
"""

from loopstack.memory.ledger.backend import (
    LedgerBackend,
    LedgerTx,
    is_url,
    open_ledger,
    redact_url,
    url_key,
)
from loopstack.memory.ledger.rows import Change, NewRecord, new_id
from loopstack.memory.ledger.sqlite import SqliteLedger

__all__ = [
    "Change",
    "LedgerBackend",
    "LedgerTx",
    "NewRecord",
    "SqliteLedger",
    "is_url",
    "new_id",
    "open_ledger",
    "redact_url",
    "url_key",
]
