"""The memory volume's upgrade (issue 41, item 1), on real PostgreSQL data directories laid out
the way each release of the manifests made them, through the command docs/deploy.md gives.

The official image initialises an empty volume with ``initdb --username=$POSTGRES_USER``, makes
``$POSTGRES_DB`` and runs the init scripts; its pg_hba trusts the local socket and asks a
password over TCP. Before issue 35 the manifests set ``POSTGRES_USER=loopstack``: the app role
was the bootstrap superuser and no ``postgres`` role existed. Since then the bootstrap role is
``postgres`` and ``initdb/10-app-role.sql`` makes ``loopstack`` an ordinary role. Here both
layouts are made the same way (initdb, then the database, then the scripts, with a real
server: the PostgreSQL 15 of ``loopstack.bench.memory.local_postgres``), memories are written as
each release's workers wrote them, and the script the docs name runs with the environment the
rendered postgres pod gives it (``kubectl exec`` runs it in that pod)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from loopstack.bench.memory.local_postgres import pg_bindir
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.ledger.postgres import PostgresLedger
from tests.ports import free_port
from tests.unit.deploy.conftest import DEPLOY, ROOT, Doc, by_kind

DOC = ROOT / "docs/deploy.md"
INIT_SQL = DEPLOY / "k8s/agent-memory/initdb/10-app-role.sql"
EXEC = re.compile(r"^\s*kubectl -n loopstack exec postgres-0 -- (.+)$", re.M)
ADMIN_PW, APP_PW = "admin-secret-1", "app-secret-2"  # Secrets memory-postgres-admin / -postgres
SECRETS = {"memory-postgres-admin": ADMIN_PW, "memory-postgres": APP_PW}
HELPER = "loopstack_upgrade"

try:
    BIN = pg_bindir()
except RuntimeError:
    BIN = Path("/nonexistent")
pytestmark = pytest.mark.skipif(
    not (BIN / "initdb").exists(), reason="no PostgreSQL server binaries (make postgres)"
)


class Volume:
    """A data directory initialised as the official image does, and its server."""

    def __init__(self, root: Path, bootstrap: str, password: str) -> None:
        self.root, self.data, self.bootstrap = root, root / "data", bootstrap
        self.as_root = os.geteuid() == 0
        if self.as_root:  # initdb and the server refuse root: the image runs them as postgres
            shutil.chown(root, "postgres", "postgres")
        root.chmod(0o700)
        pwfile = root / "pw"
        pwfile.write_text(password + "\n")
        if self.as_root:
            shutil.chown(pwfile, "postgres", "postgres")
        self.server(
            "initdb",
            "-D",
            str(self.data),
            f"--username={bootstrap}",
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        self.port = free_port()
        self.start()

    def server(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(BIN / argv[0]), *argv[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.server(
            "pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start"
        )

    def stop(self) -> None:
        self.server("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def local(self, user: str, db: str = "loopstack") -> str:
        """The pod's own connection: the local socket, trusted."""
        return f"postgresql://{user}@/{db}?host={self.root}&port={self.port}"

    def tcp(self, user: str, password: str, db: str = "loopstack") -> str:
        """A worker's connection: TCP, password checked (SCRAM)."""
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{db}"

    def query(self, sql: str, user: str | None = None, db: str = "loopstack") -> list[tuple]:  # type: ignore[type-arg]
        with psycopg.connect(self.local(user or self.superuser(), db), autocommit=True) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def superuser(self) -> str:
        for who in ("postgres", "loopstack", HELPER):
            try:
                with psycopg.connect(self.local(who, "postgres")) as conn:
                    sql = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                    row = conn.execute(sql).fetchone()
                    if row and row[0]:
                        return who
            except psycopg.OperationalError:
                continue
        raise AssertionError("no superuser to connect as")

    def psql_file(self, user: str, path: Path, env: dict[str, str]) -> None:
        """As docker-entrypoint.sh runs an init .sql file."""
        argv = [
            str(BIN / "psql"),
            "-v",
            "ON_ERROR_STOP=1",
            "--no-psqlrc",
            "-h",
            str(self.root),
            "-p",
            str(self.port),
            "-U",
            user,
            "-d",
            "loopstack",
            "-f",
            str(path),
        ]
        out = subprocess.run(argv, env={**clean_env(), **env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("PG", "MEMORY_APP", "POSTGRES"))
    }


@pytest.fixture
def volume_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="loopstack-upgrade-"))
    yield root
    cmd = [str(BIN / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop"]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, capture_output=True, timeout=60)
    shutil.rmtree(root, ignore_errors=True)


def old_layout(root: Path) -> Volume:
    """Before issue 35: POSTGRES_USER=loopstack, POSTGRES_DB=loopstack, POSTGRES_PASSWORD from
    Secret memory-postgres (the same Secret the app role's password comes from today)."""
    v = Volume(root, "loopstack", APP_PW)
    v.query('CREATE DATABASE "loopstack"', user="loopstack", db="postgres")
    return v


def new_layout(root: Path) -> Volume:
    """Since issue 35: POSTGRES_USER=postgres, then initdb/10-app-role.sql."""
    v = Volume(root, "postgres", ADMIN_PW)
    v.query('CREATE DATABASE "loopstack"', user="postgres", db="postgres")
    v.psql_file(
        "postgres", INIT_SQL, {"MEMORY_APP_USER": "loopstack", "MEMORY_APP_PASSWORD": APP_PW}
    )
    return v


async def write_memories(url: str, tmp: Path, *, allow_no_rls: bool) -> None:
    settings = MemorySettings(
        index_dir=tmp / f"replica-{os.urandom(3).hex()}", allow_no_rls=allow_no_rls
    )
    st = AsyncMemoryStore(url, embedder=HashingEmbedder(), settings=settings)
    facts = [
        ("alice", "Alice's build server is called kestrel"),
        ("alice", "Alice deploys on Fridays"),
        ("bob", "Bob's VPN token rotates hourly"),
    ]
    for user, fact in facts:
        await st.add(fact, user_id=user)
    await st.close()


# ----------------------------------------------------------------- the command the docs give
def upgrade_command() -> list[str]:
    found = EXEC.findall(DOC.read_text())
    assert len(found) == 1, (
        f"docs/deploy.md should give one `kubectl exec postgres-0` command: {found}"
    )
    return shlex.split(found[0])


def run_upgrade(
    v: Volume, rendered: dict[str, list[Doc]], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """The docs' command as `kubectl exec` runs it in the rendered postgres pod: its files from
    the ConfigMaps mounted there, its environment from the container's env and Secrets; the
    server is this volume's (PGHOST/PGPORT stand for the pod's default socket)."""
    docs = rendered["deploy/k8s/agent-memory"]
    sts = by_kind(docs, "StatefulSet", "postgres")
    spec = sts["spec"]["template"]["spec"]
    pod = spec["containers"][0]
    argv = upgrade_command()
    files = tmp / "pod"
    for i, arg in enumerate(argv):
        mount = next((m for m in pod["volumeMounts"] if arg.startswith(m["mountPath"] + "/")), None)
        if mount is None:
            continue
        vol = next(x for x in spec["volumes"] if x["name"] == mount["name"])
        assert "configMap" in vol, f"{arg} is not on a ConfigMap the manifests ship"
        cm = by_kind(docs, "ConfigMap", vol["configMap"]["name"])
        rel = arg[len(mount["mountPath"]) + 1 :]
        assert rel in cm["data"], f"{arg}: ConfigMap {cm['metadata']['name']} has no {rel}"
        target = files / mount["name"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(cm["data"][rel])
        argv[i] = str(target)
    env = clean_env()
    for e in pod["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = SECRETS[e["valueFrom"]["secretKeyRef"]["name"]]
    env.update(PGHOST=str(v.root), PGPORT=str(v.port), PATH=f"{BIN}:{env['PATH']}")
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------- the end state
def assert_current_layout(v: Volume, tmp: Path) -> None:
    roles = {
        r[0]: r[1:]
        for r in v.query(
            "SELECT rolname, rolsuper, rolbypassrls, rolcanlogin, oid = 10 FROM pg_roles "
            f"WHERE rolname IN ('postgres', 'loopstack', '{HELPER}')"
        )
    }
    assert set(roles) == {"postgres", "loopstack"}, roles  # the temporary superuser is gone
    admin, app = roles["postgres"], roles["loopstack"]
    assert (admin[0], admin[2], admin[3]) == (True, True, True)  # superuser, login, bootstrap
    assert app == (False, False, True, False), app  # the app role: ordinary
    (owner,) = v.query(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'loopstack'"
    )
    assert owner == ("loopstack",)
    owners = v.query("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
    assert owners == [("loopstack",)], owners
    funcs = v.query(
        "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE nspname = 'public'"
    )
    assert funcs == [("loopstack",)], funcs
    # passwords over TCP, as the workers and an admin connect: each role its own Secret's
    with psycopg.connect(v.tcp("loopstack", APP_PW)) as conn:
        conn.execute("SELECT 1")
    with psycopg.connect(v.tcp("postgres", ADMIN_PW)) as conn:
        conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(v.tcp("postgres", APP_PW))  # the app's password is no superuser's
    # the ledger opens as the app role with row-level security on, and binds it
    ledger = PostgresLedger(v.tcp("loopstack", APP_PW))
    try:
        assert ledger.row_security is True
    finally:
        ledger.close()
    with psycopg.connect(v.tcp("loopstack", APP_PW)) as conn:
        conn.execute("SELECT set_config('loopstack.user_id', 'alice', false)")
        seen = conn.execute("SELECT DISTINCT user_id FROM records").fetchall()
        assert seen == [("alice",)]
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (2,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO events (record_id, user_id, ts, kind, detail) "
                "VALUES ('x', 'bob', 0, 'k', 'd')"
            )
    # a worker of this release writes and reads through the store
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp, allow_no_rls=False))


def superusers(v: Volume) -> int:
    (row,) = v.query("SELECT count(*) FROM pg_roles WHERE rolsuper")
    return int(row[0])


def test_the_docs_upgrade_command_runs_a_script_the_postgres_pod_mounts(
    rendered: dict[str, list[Doc]],
) -> None:
    argv = upgrade_command()
    assert argv[0] == "sh"
    docs = rendered["deploy/k8s/agent-memory"]
    pod = by_kind(docs, "StatefulSet", "postgres")["spec"]["template"]["spec"]["containers"][0]
    assert any(argv[1].startswith(m["mountPath"] + "/") for m in pod["volumeMounts"])
    # compose mounts the same folder at the same place
    compose = (DEPLOY / "compose/compose.yaml").read_text()
    assert f"../k8s/agent-memory/upgrade:{Path(argv[1]).parent}:ro" in compose


def test_an_old_layout_volume_is_upgraded_and_a_rerun_changes_nothing(
    rendered: dict[str, list[Doc]], volume_root: Path, tmp_path: Path
) -> None:
    v = old_layout(volume_root)
    # the workers of that release: the superuser app role (RLS did not bind it)
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp_path, allow_no_rls=True))
    assert v.query("SELECT rolsuper, oid = 10 FROM pg_roles WHERE rolname = 'loopstack'") == [
        (True, True)
    ]
    assert v.query("SELECT 1 FROM pg_roles WHERE rolname = 'postgres'") == []
    # the command the docs gave before fails on it, as the issue says
    psql = [str(BIN / "psql"), "-h", str(v.root), "-p", str(v.port)]
    out = subprocess.run(
        [*psql, "-U", "postgres", "-d", "loopstack", "-c", "SELECT 1"],
        capture_output=True,
        text=True,
    )
    assert 'role "postgres" does not exist' in out.stderr
    before = v.query("SELECT id, user_id, text FROM records ORDER BY id", user="loopstack")
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_current_layout(v, tmp_path)
    after = v.query("SELECT id, user_id, text FROM records ORDER BY id")
    assert set(before) <= set(after) and len(before) == 3  # nothing lost
    again = run_upgrade(v, rendered, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_current_layout(v, tmp_path)


def test_a_current_layout_volume_stays_as_it_is(
    rendered: dict[str, list[Doc]], volume_root: Path, tmp_path: Path
) -> None:
    v = new_layout(volume_root)
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp_path, allow_no_rls=False))
    oids = v.query("SELECT rolname, oid FROM pg_roles WHERE rolname IN ('postgres', 'loopstack')")
    for _ in (1, 2):
        out = run_upgrade(v, rendered, tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert_current_layout(v, tmp_path)
    assert (
        v.query("SELECT rolname, oid FROM pg_roles WHERE rolname IN ('postgres', 'loopstack')")
        == oids
    )


def test_an_app_role_made_superuser_beside_the_admin_is_made_ordinary(
    rendered: dict[str, list[Doc]], volume_root: Path, tmp_path: Path
) -> None:
    v = new_layout(volume_root)
    v.query("ALTER ROLE loopstack SUPERUSER BYPASSRLS")
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp_path, allow_no_rls=True))
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_current_layout(v, tmp_path)


def test_a_failed_upgrade_changes_nothing_and_a_rerun_finishes(
    rendered: dict[str, list[Doc]], volume_root: Path, tmp_path: Path
) -> None:
    v = old_layout(volume_root)
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp_path, allow_no_rls=True))
    # something fails half-way (here an event trigger refuses the tables' change of owner)
    v.query(
        "CREATE FUNCTION refuse() RETURNS event_trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused'; END $$; "
        "CREATE EVENT TRIGGER refuse ON ddl_command_start WHEN TAG IN ('ALTER TABLE') "
        "EXECUTE FUNCTION refuse()"
    )
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode != 0 and "refused" in out.stderr
    assert superusers(v) >= 1
    # the renames and the demotion were rolled back with it
    roles = v.query(
        "SELECT rolname, rolsuper FROM pg_roles "
        "WHERE rolname IN ('postgres', 'loopstack') ORDER BY 1"
    )
    assert roles == [("loopstack", True)]
    v.query("DROP EVENT TRIGGER refuse; DROP FUNCTION refuse()")
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_current_layout(v, tmp_path)


def test_a_cluster_left_without_a_superuser_is_named_and_recovered_as_it_says(
    rendered: dict[str, list[Doc]], volume_root: Path, tmp_path: Path
) -> None:
    """What the old documented fix did when run as `loopstack` (PostgreSQL 15 allows it;
    16+ refuses to demote the bootstrap role)."""
    v = old_layout(volume_root)
    asyncio.run(write_memories(v.tcp("loopstack", APP_PW), tmp_path, allow_no_rls=True))
    (version,) = v.query("SHOW server_version_num", user="loopstack")
    if int(version[0]) >= 160000:
        pytest.skip("PostgreSQL 16+ refuses to demote the bootstrap role: no such volume")
    v.psql_file(
        "loopstack", INIT_SQL, {"MEMORY_APP_USER": "loopstack", "MEMORY_APP_PASSWORD": APP_PW}
    )
    assert v.query("SELECT count(*) FROM pg_roles WHERE rolsuper", user="loopstack") == [(0,)]
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode == 1
    assert "NO superuser" in out.stderr
    fix = re.search(
        r"^memory-roles:\s+echo '(.+)' \| postgres --single -D \"\$PGDATA\" (\w+)$",
        out.stderr,
        re.M,
    )
    assert fix, out.stderr
    v.stop()
    v.server("postgres", "--single", "-D", str(v.data), fix.group(2), stdin=fix.group(1) + "\n")
    v.start()
    out = run_upgrade(v, rendered, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_current_layout(v, tmp_path)


def test_the_script_passes_shellcheck() -> None:
    script = DEPLOY / "k8s/agent-memory/upgrade/memory-roles.sh"
    sc = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    out = subprocess.run([sc, "-s", "sh", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
