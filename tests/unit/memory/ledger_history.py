"""The ledgers of earlier releases, as they made them: fixtures for the upgrade tests."""

_POLICY = (
    "user_id = current_setting('loopstack.user_id', true) "
    "OR current_setting('loopstack.user_id', true) = '*'"
)

#: Postgres schema 1 (the first release of the Postgres ledger; ``meta`` is made before it).
PG_V1 = """
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
CREATE POLICY scope ON {t} USING ({_POLICY}) WITH CHECK ({_POLICY});
"""
    for t in ("records", "vectors", "changes", "observations", "events", "user_terms")
)


#: SQLite schema 1 (the first release).
SQLITE_V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    rowid         INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    user_id       TEXT NOT NULL,
    agent_id      TEXT,
    session_id    TEXT,
    text          TEXT NOT NULL,
    type          TEXT NOT NULL,
    source        TEXT NOT NULL,
    confidence    REAL NOT NULL,
    created_at    REAL NOT NULL,
    last_used_at  REAL,
    hits          INTEGER NOT NULL DEFAULT 0,
    weight        REAL NOT NULL,
    superseded_by TEXT,
    evidence      TEXT NOT NULL DEFAULT '[]',
    mentions      INTEGER NOT NULL DEFAULT 1,
    fingerprint   TEXT NOT NULL,
    scope_token   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_user ON records(user_id, superseded_by);
CREATE INDEX IF NOT EXISTS records_fp ON records(user_id, fingerprint);
CREATE INDEX IF NOT EXISTS records_sup ON records(superseded_by);
CREATE TABLE IF NOT EXISTS vectors (rowid INTEGER PRIMARY KEY, vec BLOB NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS records_fts USING fts5(
    text, scope_token, content='records', content_rowid='rowid',
    tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE IF NOT EXISTS records_vocab USING fts5vocab(records_fts, 'row');
CREATE TRIGGER IF NOT EXISTS records_ai AFTER INSERT ON records BEGIN
    INSERT INTO records_fts(rowid, text, scope_token)
    VALUES (new.rowid, new.text, new.scope_token);
END;
-- Superseded records leave the FTS index (so keyword recall needs no join to skip them).
CREATE TRIGGER IF NOT EXISTS records_au AFTER UPDATE OF superseded_by ON records
WHEN old.superseded_by IS NULL AND new.superseded_by IS NOT NULL BEGIN
    INSERT INTO records_fts(records_fts, rowid, text, scope_token)
    VALUES ('delete', old.rowid, old.text, old.scope_token);
END;
CREATE TRIGGER IF NOT EXISTS records_ad AFTER DELETE ON records BEGIN
    INSERT INTO records_fts(records_fts, rowid, text, scope_token)
    SELECT 'delete', old.rowid, old.text, old.scope_token WHERE old.superseded_by IS NULL;
    DELETE FROM vectors WHERE rowid = old.rowid;
END;
CREATE TABLE IF NOT EXISTS changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    op      TEXT NOT NULL CHECK (op IN ('add', 'del')),
    rowid   INTEGER NOT NULL,
    user_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS observations (
    user_id     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    text        TEXT NOT NULL,
    type        TEXT NOT NULL,
    count       INTEGER NOT NULL,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    vec         BLOB NOT NULL,
    PRIMARY KEY (user_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS events (
    record_id TEXT NOT NULL,
    ts        REAL NOT NULL,
    kind      TEXT NOT NULL,
    detail    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_record ON events(record_id);
CREATE TABLE IF NOT EXISTS user_terms (
    user_id TEXT NOT NULL,
    term    TEXT NOT NULL,
    df      INTEGER NOT NULL,
    PRIMARY KEY (user_id, term)
) WITHOUT ROWID;
"""
