"""The Postgres ledger's schema, its versioned migrations and its row-level security.

The tables are declared once for both ledgers (``loopstack.memory.ledger.schema``); what is
Postgres's own:

* keyword recall goes through ``postings`` (user, lexeme, rowid: a btree) of the active
  records, in place of FTS5; triggers fill it from a ``tsvector`` column (``english``
  configuration) of ``records``. Not a GIN index on ``tsv``: ``@@`` is not LEAKPROOF, so
  under row-level security Postgres may not use it as an index condition and scanned every
  record of the user instead (1.3 s per query at 1M records); the btree's ``text =`` is
  LEAKPROOF;
* the change log's ``seq`` is not a sequence but a counter row (``change_seq``) bumped at the
  very end of each writing transaction: its row lock orders the commits, so seqs are
  consecutive (a rolled-back transaction leaves no gap) and become visible in order, which
  the index replicas rely on (``loopstack.memory.replica``);
* every table holding a user's data carries ``user_id`` and a row-level security policy keyed
  by ``loopstack.user_id``, a setting the ledger sets per transaction (``SET LOCAL``): a
  query run under one user's scope cannot see another user's rows, whatever its WHERE clause.
  The value ``*`` is the ledger's own maintenance scope (index replay, stats, migration).
  ``FORCE ROW LEVEL SECURITY`` makes the policies bind the table owner too; superusers and
  roles with ``BYPASSRLS`` are never bound, so the app must connect as an ordinary role.
"""

from __future__ import annotations

from loopstack.memory.ledger.rows import POSTGRES
from loopstack.memory.ledger.schema import POSTINGS, create_indexes, create_table, tables_of

__all__ = [
    "ALL",
    "CHANNEL",
    "CURRENT",
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
RLS_TABLES = tuple(t.name for t in tables_of("postgres") if t.rls)

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


#: Keyword postings of the active records, kept by triggers on ``records`` (every insert
#: path, the SQLite migration's included): added with the record, removed when it is
#: superseded or deleted. Records are never re-texted, and nothing un-supersedes one.
_POSTINGS_TRIGGERS = """
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
"""

# The current schema of a new database: the declared tables (``loopstack.memory.ledger.schema``) and
#: Postgres's own: the change-log counter's row, the postings triggers, the policies.
CURRENT = (
    "".join(create_table(t, POSTGRES) + create_indexes(t) for t in tables_of("postgres"))
    + "INSERT INTO change_seq(one, last) VALUES (true, 0) ON CONFLICT DO NOTHING;\n"
    + _POSTINGS_TRIGGERS
    + "".join(_policy(t) for t in RLS_TABLES)
)

_V2 = (
    "SELECT set_config('loopstack.user_id', '*', true);\n"
    + create_table(POSTINGS, POSTGRES)
    + _POSTINGS_TRIGGERS
    + """INSERT INTO postings(user_id, term, rowid)
SELECT r.user_id, t, r.rowid FROM records r, unnest(tsvector_to_array(r.tsv)) t
WHERE r.superseded_by IS NULL
ON CONFLICT DO NOTHING;
DROP INDEX IF EXISTS records_tsv;
"""
    + _policy("postings")
)

#: Schema 3: ``meta.value`` NOT NULL, as declared (and as SQLite always had it).
_V3 = "ALTER TABLE meta ALTER COLUMN value SET NOT NULL;\n"

#: version -> DDL that brings a database of the previous version to it (run once, in order,
#: under a lock). A new database gets :data:`CURRENT` and the newest version at once; schema
#: 1 (the tables without ``postings``) is what the first release made.
MIGRATIONS: dict[int, str] = {2: _V2, 3: _V3}
PG_SCHEMA_VERSION = max(MIGRATIONS)
