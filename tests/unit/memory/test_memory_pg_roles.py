"""Per-user isolation in the shared Postgres memory cannot be silently off (issue 35, defect
1): the ledger refuses a role that row-level security does not bind (a superuser, or
BYPASSRLS) unless LOOPSTACK_MEMORY_ALLOW_NO_RLS says otherwise, and the init SQL the deploy
manifests give the official postgres image makes the ordinary app role the workers use.
A real PostgreSQL (``loopstack.bench.memory.local_postgres``) runs here; the SQL runs through the
real ``psql`` as the image's entrypoint runs it."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, LoopstackMemoryError, MemorySettings
from loopstack.memory.exceptions import LedgerError, RowSecurityError
from loopstack.memory.ledger.postgres import PostgresLedger

ROOT = Path(__file__).resolve().parents[3]
INIT_SQL = ROOT / "deploy/k8s/agent-memory/initdb/10-app-role.sql"


def admin(pg: LocalPostgres, sql: str) -> None:
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def database_for(pg: LocalPostgres, db: str, role: str, owner: str | None = None) -> str:
    admin(pg, f"CREATE DATABASE {db} OWNER {owner or role}")
    return f"postgresql://{role}@127.0.0.1:{pg.port}/{db}"


def tables(pg: LocalPostgres, db: str) -> set[str]:
    url = f"postgresql://postgres@127.0.0.1:{pg.port}/{db}"
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


def test_the_ledger_refuses_a_superuser_before_creating_anything(
    postgres: LocalPostgres,
) -> None:
    url = database_for(postgres, "rls_superuser", "postgres")
    with pytest.raises(RowSecurityError, match="superuser") as info:
        PostgresLedger(url)
    assert isinstance(info.value, LedgerError | LoopstackMemoryError)
    assert "LOOPSTACK_MEMORY_ALLOW_NO_RLS" in str(info.value)
    assert tables(postgres, "rls_superuser") == set()  # nothing created as the superuser


def test_the_ledger_refuses_a_bypassrls_role(postgres: LocalPostgres) -> None:
    admin(postgres, "CREATE ROLE bypasser LOGIN NOSUPERUSER BYPASSRLS")
    url = database_for(postgres, "rls_bypass", "bypasser")
    with pytest.raises(RowSecurityError, match="BYPASSRLS"):
        PostgresLedger(url)


async def test_the_store_surfaces_the_refusal(postgres: LocalPostgres, tmp_path: Path) -> None:
    url = database_for(postgres, "rls_store", "postgres")
    settings = MemorySettings(index_dir=tmp_path / "replica")
    st = AsyncMemoryStore(url, embedder=HashingEmbedder(), settings=settings)
    with pytest.raises(RowSecurityError):
        await st.add("a fact", user_id="alice")


async def test_allow_no_rls_opens_with_a_warning(
    postgres: LocalPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = database_for(postgres, "rls_allowed", "postgres")
    monkeypatch.setenv("LOOPSTACK_MEMORY_ALLOW_NO_RLS", "1")
    settings = MemorySettings(index_dir=tmp_path / "replica")
    assert settings.allow_no_rls is True
    st = AsyncMemoryStore(url, embedder=HashingEmbedder(), settings=settings)
    with caplog.at_level(logging.WARNING, logger="loopstack.memory.ledger.postgres"):
        await st.add("Alice likes tea", user_id="alice")
    assert (await st.stats())["rls"] is False
    assert any("row-level security does not apply" in r.getMessage() for r in caplog.records)
    await st.close()


def run_init_sql(
    pg: LocalPostgres, db: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """As docker-entrypoint.sh runs an initdb .sql file (psql -v ON_ERROR_STOP=1 as the
    admin user, on POSTGRES_DB)."""
    psql = pg.bindir / "psql"
    argv = [str(psql), "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "-h", "127.0.0.1",
            "-p", str(pg.port), "-U", "postgres", "-d", db, "-f", str(INIT_SQL)]  # fmt: skip
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MEMORY_APP"))}
    return subprocess.run(argv, env={**keep, **env}, capture_output=True, text=True, timeout=60)


def test_the_deploy_init_sql_makes_an_ordinary_owner_role(postgres: LocalPostgres) -> None:
    admin(postgres, "CREATE DATABASE initdb_app")  # POSTGRES_DB, made by the entrypoint
    env = {"MEMORY_APP_USER": "memapp", "MEMORY_APP_PASSWORD": "s3cret-app"}
    for _ in (1, 2):  # a rerun (by hand, on an old volume) is harmless
        out = run_init_sql(postgres, "initdb_app", env)
        assert out.returncode == 0, out.stdout + out.stderr
    with psycopg.connect(postgres.admin_url) as conn:
        role = conn.execute(
            "SELECT rolsuper, rolbypassrls, rolcanlogin, rolcreaterole, rolpassword IS NOT NULL "
            "FROM pg_authid WHERE rolname = 'memapp'"
        ).fetchone()
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'initdb_app'"
        ).fetchone()
    assert role == (False, False, True, False, True)
    assert owner == ("memapp",)
    ledger = PostgresLedger(f"postgresql://memapp@127.0.0.1:{postgres.port}/initdb_app")
    try:
        assert ledger.row_security is True
    finally:
        ledger.close()


def test_the_init_sql_demotes_an_old_superuser_app_role(postgres: LocalPostgres) -> None:
    """The layout before issue 35 made the app role the image's superuser."""
    admin(postgres, "CREATE ROLE oldapp LOGIN SUPERUSER")
    admin(postgres, "CREATE DATABASE initdb_old OWNER oldapp")
    env = {"MEMORY_APP_USER": "oldapp", "MEMORY_APP_PASSWORD": "pw"}
    out = run_init_sql(postgres, "initdb_old", env)
    assert out.returncode == 0, out.stdout + out.stderr
    ledger = PostgresLedger(f"postgresql://oldapp@127.0.0.1:{postgres.port}/initdb_old")
    assert ledger.row_security is True
    ledger.close()


@pytest.mark.parametrize("missing", ["MEMORY_APP_USER", "MEMORY_APP_PASSWORD"])
def test_the_init_sql_fails_closed_without_its_settings(
    postgres: LocalPostgres, missing: str
) -> None:
    db = f"initdb_no_{missing.lower()}"
    admin(postgres, f"CREATE DATABASE {db}")
    env = {"MEMORY_APP_USER": "x_app", "MEMORY_APP_PASSWORD": "pw"}
    del env[missing]
    out = run_init_sql(postgres, db, env)
    assert out.returncode != 0
    assert f"{missing} is not set" in out.stdout + out.stderr
