"""The Postgres ledger's schema, its versioned migrations and its row-level security.

The tables mirror the SQLite ledger's (``memory.schema``) with three differences:

* keyword recall goes through ``postings`` (user, lexeme, rowid: a btree) of the active
  records, in place of FTS5; triggers fill it from a ``tsvector`` column (``english``
  configuration) of ``records``. Not a GIN index on ``tsv``: ``@@`` is not LEAKPROOF, so
  under row-level security Postgres may not use it as an index condition and scanned every
  record of the user instead (1.3 s per query at 1M records); the btree's ``text =`` is
  LEAKPROOF;
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
_V1_TABLES = ("records", "vectors", "changes", "observations", "events", "user_terms")
RLS_TABLES = (*_V1_TABLES, "postings")  # postings: schema v2

_POLICY = (
    "user_id = current_setting('loopstack.user_id', true) "
    "OR current_setting('loopstack.user_id', true) = '*'"
)


def _policy(table: str) -> str:
    return f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS scope ON {table};
CREATE POLICY scope ON {table} USING ({_POLICY}) WITH CHECK ({_POLICY});
"""


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
""" + "".join(_policy(t) for t in _V1_TABLES)


#: Keyword postings of the active records, kept by triggers on ``records`` (every insert
#: path, the SQLite migration's included): added with the record, removed when it is
#: superseded or deleted. Records are never re-texted, and nothing un-supersedes one.
_V2 = """
SELECT set_config('loopstack.user_id', '*', true);
CREATE TABLE IF NOT EXISTS postings (
    user_id TEXT NOT NULL,
    term    TEXT NOT NULL,
    rowid   BIGINT NOT NULL,
    PRIMARY KEY (user_id, term, rowid)
);
CREATE OR REPLACE FUNCTION postings_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO postings(user_id, term, rowid)
    SELECT n.user_id, t, n.rowid FROM new_rows n, unnest(tsvector_to_array(n.tsv)) t
    WHERE n.superseded_by IS NULL
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION postings_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM postings p USING old_rows o
    WHERE p.user_id = o.user_id AND p.rowid = o.rowid
      AND p.term = ANY(tsvector_to_array(o.tsv));
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION postings_sup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM postings WHERE user_id = OLD.user_id AND rowid = OLD.rowid
      AND term = ANY(tsvector_to_array(OLD.tsv));
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS records_postings_add ON records;
CREATE TRIGGER records_postings_add AFTER INSERT ON records
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION postings_add();
DROP TRIGGER IF EXISTS records_postings_del ON records;
CREATE TRIGGER records_postings_del AFTER DELETE ON records
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION postings_del();
DROP TRIGGER IF EXISTS records_postings_sup ON records;
CREATE TRIGGER records_postings_sup AFTER UPDATE OF superseded_by ON records FOR EACH ROW
    WHEN (OLD.superseded_by IS NULL AND NEW.superseded_by IS NOT NULL)
    EXECUTE FUNCTION postings_sup();
INSERT INTO postings(user_id, term, rowid)
SELECT r.user_id, t, r.rowid FROM records r, unnest(tsvector_to_array(r.tsv)) t
WHERE r.superseded_by IS NULL
ON CONFLICT DO NOTHING;
DROP INDEX IF EXISTS records_tsv;
""" + _policy("postings")

#: version -> DDL that brings the previous version to it (run once, in order, under a lock).
MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2}
PG_SCHEMA_VERSION = max(MIGRATIONS)
