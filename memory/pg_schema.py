"""The Postgres ledger's schema, its versioned migrations and its row-level security.

The tables mirror the SQLite ledger's (``memory.schema``) with three differences:

* keyword recall is a ``tsvector`` column (``english`` configuration) with a GIN index over
  the active records, in place of FTS5;
* the change log's ``seq`` is not a sequence but a counter row (``change_seq``) bumped at the
  very end of each writing transaction: its row lock orders the commits, so seqs are
  consecutive (a rolled-back transaction leaves no gap) and become visible in order, which
  the index replicas rely on (``memory.replica``);
* every table holding a user's data carries ``user_id`` and a row-level security policy keyed
  by ``loopstack.user_id``, a setting the ledger sets per transaction (``SET LOCAL``): a
  query run under one user's scope cannot see another user's rows, whatever its WHERE clause.
  The value ``*`` is the ledger's own maintenance scope (index replay, stats, migration).
  ``FORCE ROW LEVEL SECURITY`` makes the policies bind the table owner too; superusers and
  roles with ``BYPASSRLS`` are never bound, so the app must connect as an ordinary role.
"""

from __future__ import annotations

__all__ = [
    "ALL",
    "CHANNEL",
    "MIGRATIONS",
    "PG_SCHEMA_VERSION",
    "RLS_TABLES",
    "SCOPE_SETTING",
    "SET_SCOPE",
]

SCOPE_SETTING = "loopstack.user_id"
#: Sets the scope for the rest of the transaction: a user id, or ALL.
SET_SCOPE = f"SELECT set_config('{SCOPE_SETTING}', %s, true)"
#: The maintenance scope: index replay, stats, migration.
ALL = "*"
#: NOTIFY channel that wakes other app servers' replicas (payload: the newest seq).
CHANNEL = "loopstack_memory"

#: Tables whose rows belong to one user, each protected by the ``scope`` policy.
RLS_TABLES = ("records", "vectors", "changes", "observations", "events", "user_terms")

_POLICY = (
    "user_id = current_setting('loopstack.user_id', true) "
    "OR current_setting('loopstack.user_id', true) = '*'"
)

_V1 = """
CREATE TABLE IF NOT EXISTS records (
    rowid         BIGSERIAL PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    user_id       TEXT NOT NULL,
    agent_id      TEXT,
    session_id    TEXT,
    text          TEXT NOT NULL,
    type          TEXT NOT NULL,
    source        TEXT NOT NULL,
    confidence    DOUBLE PRECISION NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    last_used_at  DOUBLE PRECISION,
    hits          INTEGER NOT NULL DEFAULT 0,
    weight        DOUBLE PRECISION NOT NULL,
    superseded_by TEXT,
    evidence      TEXT NOT NULL DEFAULT '[]',
    mentions      INTEGER NOT NULL DEFAULT 1,
    fingerprint   TEXT NOT NULL,
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX IF NOT EXISTS records_user ON records(user_id, superseded_by);
CREATE INDEX IF NOT EXISTS records_fp ON records(user_id, fingerprint);
CREATE INDEX IF NOT EXISTS records_sup ON records(superseded_by);
CREATE INDEX IF NOT EXISTS records_tsv ON records USING GIN (tsv) WHERE superseded_by IS NULL;
CREATE TABLE IF NOT EXISTS vectors (
    rowid   BIGINT PRIMARY KEY REFERENCES records(rowid) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    vec     BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    seq     BIGINT PRIMARY KEY,
    op      TEXT NOT NULL CHECK (op IN ('add', 'del')),
    rowid   BIGINT NOT NULL,
    user_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS change_seq (
    one  BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    last BIGINT NOT NULL
);
INSERT INTO change_seq(one, last) VALUES (true, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS observations (
    user_id     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    text        TEXT NOT NULL,
    type        TEXT NOT NULL,
    count       INTEGER NOT NULL,
    first_seen  DOUBLE PRECISION NOT NULL,
    last_seen   DOUBLE PRECISION NOT NULL,
    vec         BYTEA NOT NULL,
    PRIMARY KEY (user_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS events (
    seq       BIGSERIAL PRIMARY KEY,
    record_id TEXT NOT NULL,
    user_id   TEXT NOT NULL,
    ts        DOUBLE PRECISION NOT NULL,
    kind      TEXT NOT NULL,
    detail    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_record ON events(record_id);
CREATE TABLE IF NOT EXISTS user_terms (
    user_id TEXT NOT NULL,
    term    TEXT NOT NULL,
    df      INTEGER NOT NULL,
    PRIMARY KEY (user_id, term)
);
""" + "".join(
    f"""
ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {t} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS scope ON {t};
CREATE POLICY scope ON {t} USING ({_POLICY}) WITH CHECK ({_POLICY});
"""
    for t in RLS_TABLES
)

#: version -> DDL that brings the previous version to it (run once, in order, under a lock).
MIGRATIONS: dict[int, str] = {1: _V1}
PG_SCHEMA_VERSION = max(MIGRATIONS)
