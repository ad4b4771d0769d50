"""The ledger's tables, declared once for both databases.

Each :class:`Table` lists its columns with a portable type (:data:`ColumnType`); a
:class:`~loopstack.memory.ledger.rows.Dialect` names each type in its database, and
:func:`create_table` / :func:`create_indexes` render the DDL. ``sqlite.py`` and
``postgres_schema.py`` render these and add only what is truly their own:

* SQLite: the FTS5 keyword index (``records_fts``, ``records_vocab``) and its triggers, the
  trigger that deletes a record's vector with it, ``WITHOUT ROWID`` for ``user_terms``;
* Postgres: the row-level security policies (every table with ``rls``), the postings
  triggers, the foreign key from ``vectors`` to ``records``, the change-log counter row.

The columns one database has and the other has not are marked ``only`` here, each with its
reason; ``tests/unit/memory/test_memory_schema.py`` reads both databases' own catalogues and
checks that every other column agrees (name, order, type through the dialect, nullability).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "EVENTS",
    "META",
    "POSTINGS",
    "TABLES",
    "Column",
    "ColumnType",
    "DialectName",
    "Table",
    "create_indexes",
    "create_table",
    "tables_of",
]

ColumnType = Literal["text", "int", "bigint", "real", "blob", "bool", "tsvector"]
DialectName = Literal["sqlite", "postgres"]


class Dialect(Protocol):
    """What rendering needs of a database's dialect (`loopstack.memory.ledger.rows.Dialect` is one):
    its name and its name for each column type. Declared here so the schema imports nothing
    of the ledger code that renders it."""

    @property
    def name(self) -> DialectName: ...

    def type_of(self, kind: ColumnType) -> str: ...


_BOTH: tuple[DialectName, ...] = ("sqlite", "postgres")


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    null: bool = False
    default: str | None = None
    check: str | None = None
    #: Where the key numbers itself (SQLite ``AUTOINCREMENT``, Postgres ``BIGSERIAL``).
    serial: tuple[DialectName, ...] = ()
    unique: bool = False
    #: A foreign key, Postgres only (SQLite does not enforce them: a trigger does the job).
    references: str | None = None
    #: A stored generated column: its expression.
    generated: str | None = None
    #: The one database that has this column (None: both).
    only: DialectName | None = None


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    #: (index name, its column list)
    indexes: tuple[tuple[str, str], ...] = ()
    #: The one database that has this table (None: both).
    only: DialectName | None = None
    #: Holds one user's rows (``user_id``): Postgres guards it with the ``scope`` policy.
    rls: bool = False
    #: SQLite: a clustered table (its key is the storage order).
    without_rowid: bool = False

    def columns_in(self, dialect: DialectName) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.only in (None, dialect))


def _text(
    name: str,
    *,
    null: bool = False,
    default: str | None = None,
    check: str | None = None,
    unique: bool = False,
    only: DialectName | None = None,
) -> Column:
    return Column(name, "text", null, default, check, unique=unique, only=only)


META = Table("meta", (_text("key"), _text("value")), key=("key",))

RECORDS = Table(
    "records",
    (
        Column("rowid", "bigint", serial=_BOTH),
        _text("id", unique=True),
        _text("user_id"),
        _text("agent_id", null=True),
        _text("session_id", null=True),
        _text("text"),
        _text("type"),
        _text("source"),
        Column("confidence", "real"),
        Column("created_at", "real"),
        Column("last_used_at", "real", null=True),
        Column("hits", "int", default="0"),
        Column("weight", "real"),
        _text("superseded_by", null=True),
        _text("evidence", default="'[]'"),
        Column("mentions", "int", default="1"),
        _text("fingerprint"),
        # FTS5's per-user token: keyword recall intersects with the user's posting list.
        _text("scope_token", only="sqlite"),
        # The lexemes the postings triggers read (Postgres's keyword recall).
        Column(
            "tsv", "tsvector", null=True, generated="to_tsvector('english', text)", only="postgres"
        ),
    ),
    key=("rowid",),
    indexes=(
        ("records_user", "user_id, superseded_by"),
        ("records_fp", "user_id, fingerprint"),
        ("records_sup", "superseded_by"),
    ),
    rls=True,
)

VECTORS = Table(
    "vectors",
    (
        Column("rowid", "bigint", references="records(rowid) ON DELETE CASCADE"),
        # Only for the row-level policy: SQLite has none, and adding it would rewrite every
        # stored vector of an existing file.
        _text("user_id", only="postgres"),
        Column("vec", "blob"),
    ),
    key=("rowid",),
    rls=True,
)

CHANGES = Table(
    "changes",
    (
        # Postgres numbers the log at commit from ``change_seq`` (consecutive, in commit order).
        Column("seq", "bigint", serial=("sqlite",)),
        _text("op", check="op IN ('add', 'del')"),
        Column("rowid", "bigint"),
        _text("user_id"),
    ),
    key=("seq",),
    rls=True,
)

CHANGE_SEQ = Table(
    "change_seq",
    (Column("one", "bool", default="true", check="one"), Column("last", "bigint")),
    key=("one",),
    only="postgres",
)

OBSERVATIONS = Table(
    "observations",
    (
        _text("user_id"),
        _text("fingerprint"),
        _text("text"),
        _text("type"),
        Column("count", "int"),
        Column("first_seen", "real"),
        Column("last_seen", "real"),
        Column("vec", "blob"),
    ),
    key=("user_id", "fingerprint"),
    rls=True,
)

EVENTS = Table(
    "events",
    (
        Column("seq", "bigint", serial=_BOTH),
        _text("record_id"),
        _text("user_id"),
        Column("ts", "real"),
        _text("kind"),
        _text("detail"),
    ),
    key=("seq",),
    indexes=(("events_record", "record_id"),),
    rls=True,
)

USER_TERMS = Table(
    "user_terms",
    (_text("user_id"), _text("term"), Column("df", "int")),
    key=("user_id", "term"),
    rls=True,
    without_rowid=True,
)

POSTINGS = Table(
    "postings",
    (_text("user_id"), _text("term"), Column("rowid", "bigint")),
    key=("user_id", "term", "rowid"),
    only="postgres",
    rls=True,
)

#: Every table, in creation order (a table after those it references).
TABLES = (META, RECORDS, VECTORS, CHANGES, CHANGE_SEQ, OBSERVATIONS, EVENTS, USER_TERMS, POSTINGS)


def tables_of(dialect: DialectName) -> tuple[Table, ...]:
    return tuple(t for t in TABLES if t.only in (None, dialect))


def _column_sql(table: Table, col: Column, d: Dialect) -> str:
    key = table.key == (col.name,)
    serial = d.name in col.serial
    if serial and d.name == "postgres":
        sql = f"{col.name} BIGSERIAL"
    else:
        sql = f"{col.name} {d.type_of(col.type)}"
    if not col.null and not (serial and d.name == "postgres"):
        sql += " NOT NULL"
    if key:
        sql += " PRIMARY KEY AUTOINCREMENT" if serial and d.name == "sqlite" else " PRIMARY KEY"
    if col.unique:
        sql += " UNIQUE"
    if col.default is not None:
        sql += f" DEFAULT {col.default}"
    if col.check is not None:
        sql += f" CHECK ({col.check})"
    if col.references is not None and d.name == "postgres":
        sql += f" REFERENCES {col.references}"
    if col.generated is not None:
        sql += f" GENERATED ALWAYS AS ({col.generated}) STORED"
    return sql


def create_table(table: Table, d: Dialect, name: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of ``table`` in dialect ``d`` (as ``name`` if given)."""
    lines = [_column_sql(table, c, d) for c in table.columns_in(d.name)]
    if len(table.key) > 1:
        lines.append(f"PRIMARY KEY ({', '.join(table.key)})")
    body = ",\n    ".join(lines)
    tail = " WITHOUT ROWID" if table.without_rowid and d.name == "sqlite" else ""
    return f"CREATE TABLE IF NOT EXISTS {name or table.name} (\n    {body}\n){tail};\n"


def create_indexes(table: Table) -> str:
    return "".join(
        f"CREATE INDEX IF NOT EXISTS {name} ON {table.name}({cols});\n"
        for name, cols in table.indexes
    )
