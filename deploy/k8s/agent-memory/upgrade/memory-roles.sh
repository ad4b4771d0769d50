#!/bin/sh
# Brings the memory database's roles to the current layout, from every layout loopstack has
# shipped (docs/deploy.md, "Upgrading from the previous release"). It runs inside the
# postgres pod (or compose service), where the server trusts its local socket and the
# environment holds the settings:
#   kubectl -n loopstack exec postgres-0 -- sh /etc/loopstack/memory-roles.sh
#
#   POSTGRES_USER        the admin, a superuser (made here when missing; default postgres)
#   POSTGRES_PASSWORD    its password (Secret memory-postgres-admin)
#   POSTGRES_DB          the memory's database (default loopstack)
#   MEMORY_APP_USER      the role the workers log in as: made an ORDINARY role (no superuser,
#                        no BYPASSRLS) that owns the database and everything in its schemas
#   MEMORY_APP_PASSWORD  its password (Secret memory-postgres)
#
# The layouts it meets:
#   - before issue 35 (POSTGRES_USER=loopstack): the app role IS the bootstrap superuser and
#     no admin exists. The bootstrap role is renamed to the admin (it stays a superuser:
#     PostgreSQL 16+ forbids removing that attribute from it, and it owns the system
#     catalogs), gets the admin's password, and a new ordinary app role takes over the
#     database and its tables;
#   - an app role that is a superuser or BYPASSRLS beside an admin: it is made ordinary;
#   - the current one (admin = bootstrap superuser, app ordinary): passwords and ownership
#     are set again, nothing else changes.
# A superuser exists at every step: the admin is made (or kept) a superuser in the same
# transaction that renames or demotes anything, and only then, with the app role's old
# sessions ended, is the temporary superuser that did it dropped. Idempotent: run it again
# at will (after a failure too: a failed run changes nothing but leaves that temporary role,
# which the next run reuses and drops).
set -eu

admin=${POSTGRES_USER:-postgres}
app=${MEMORY_APP_USER:?MEMORY_APP_USER is not set}
db=${POSTGRES_DB:-loopstack}
: "${MEMORY_APP_PASSWORD:?MEMORY_APP_PASSWORD is not set}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
# Renaming the bootstrap role needs a session of another superuser: this one, for the run.
helper=loopstack_upgrade

say() { echo "memory-roles: $*" >&2; }

if [ "$admin" = "$app" ]; then
  say "POSTGRES_USER and MEMORY_APP_USER must differ (both are '$app')"
  exit 2
fi

sql() {  # USER, then psql's arguments
  user=$1
  shift
  psql -X -q -v ON_ERROR_STOP=1 -U "$user" -d "$db" \
    -v admin="$admin" -v app="$app" -v helper="$helper" "$@"
}

# Act as a superuser that exists: the admin (current layout), the app role (the layout
# before), or the helper a failed run left behind.
actor=
seen=
for who in "$admin" "$app" "$helper"; do
  if super=$(sql "$who" -tA -c "SELECT rolsuper FROM pg_roles WHERE rolname = current_user" \
      2>/dev/null); then
    seen=$who
    if [ "$super" = t ]; then
      actor=$who
      break
    fi
  fi
done
if [ -z "$actor" ]; then
  if [ -z "$seen" ]; then
    say "cannot connect to database '$db' as '$admin' or '$app' (is the server up?)"
    exit 1
  fi
  supers=$(sql "$seen" -tA -c "SELECT count(*) FROM pg_roles WHERE rolsuper")
  if [ "$supers" = 0 ]; then
    say "this cluster has NO superuser (the bootstrap role was demoted): restore it first"
    say "with the server stopped, in single-user mode, then run this again:"
    say "  echo 'ALTER ROLE \"$seen\" SUPERUSER;' | postgres --single -D \"\$PGDATA\" $db"
    say "(docs/deploy.md, 'Upgrading from the previous release')"
  else
    say "neither '$admin' nor '$app' is a superuser; connect as one and rerun"
  fi
  exit 1
fi
say "acting as '$actor' on database '$db'"

sql "$actor" <<'SQL'
\getenv app_password MEMORY_APP_PASSWORD
\getenv admin_password POSTGRES_PASSWORD
SELECT format('CREATE ROLE %I', :'helper')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'helper') \gexec
SELECT format('ALTER ROLE %I LOGIN SUPERUSER', :'helper') \gexec
\connect - :helper

BEGIN;
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'admin') AS has_admin,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app' AND oid = 10) AS app_is_bootstrap,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app' AND (rolsuper OR rolbypassrls))
         AS app_is_privileged \gset
\if :app_is_bootstrap
  \if :has_admin
    -- An admin made by hand beside the bootstrap role: the bootstrap role is retired (it
    -- stays a superuser, as PostgreSQL requires, but nobody can log in as it).
    SELECT format('ALTER ROLE %I RENAME TO %I', :'app', :'app' || '_bootstrap') \gexec
    SELECT format('ALTER ROLE %I NOLOGIN PASSWORD NULL', :'app' || '_bootstrap') \gexec
  \else
    -- The layout before: the bootstrap superuser becomes the admin.
    SELECT format('ALTER ROLE %I RENAME TO %I', :'app', :'admin') \gexec
  \endif
\endif
SELECT format('CREATE ROLE %I', :'admin')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'admin') \gexec
ALTER ROLE :"admin" LOGIN SUPERUSER PASSWORD :'admin_password';
-- From here the admin is a superuser: the app role may lose its attributes.
SELECT format('CREATE ROLE %I', :'app')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app') \gexec
ALTER ROLE :"app" LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION
  PASSWORD :'app_password';
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'app') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()) \gexec
-- The app role owns what lives in the database's own schemas (the ledger migrates its
-- tables as their owner): schemas, tables, views, sequences of their own, functions.
-- Indexes, triggers, policies and owned sequences follow their table; members of an
-- extension and what pg_database_owner owns (the public schema) stay as they are.
WITH target AS (SELECT oid FROM pg_roles WHERE rolname = :'app'),
own AS (
  SELECT oid FROM pg_namespace
  WHERE nspname NOT IN ('pg_catalog', 'information_schema')
    AND nspname NOT LIKE 'pg\_toast%' AND nspname NOT LIKE 'pg\_temp%'
),
obj AS (
  SELECT 'pg_namespace'::regclass AS cls, n.oid, n.nspowner AS owner,
         format('SCHEMA %I', n.nspname) AS what
  FROM pg_namespace n WHERE n.oid IN (SELECT oid FROM own)
  UNION ALL
  SELECT 'pg_class'::regclass, c.oid, c.relowner,
         format('%s %s', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                         WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE'
                         ELSE 'TABLE' END, c.oid::regclass)
  FROM pg_class c
  WHERE c.relnamespace IN (SELECT oid FROM own) AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                    AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
  UNION ALL
  SELECT 'pg_proc'::regclass, p.oid, p.proowner,
         format('%s %s', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                         ELSE 'FUNCTION' END, p.oid::regprocedure)
  FROM pg_proc p WHERE p.pronamespace IN (SELECT oid FROM own)
)
SELECT format('ALTER %s OWNER TO %I', what, :'app') FROM obj
WHERE owner <> (SELECT oid FROM target) AND owner <> 'pg_database_owner'::regrole
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = obj.cls AND d.objid = obj.oid
                  AND d.deptype = 'e')
ORDER BY cls::oid, what \gexec
COMMIT;

-- Sessions opened as the app role before the change (the workers) keep what they had:
-- end them, so they reconnect as the ordinary role.
\if :app_is_privileged
  SELECT count(pg_terminate_backend(pid)) AS ended FROM pg_stat_activity
  WHERE pid <> pg_backend_pid() AND usesysid IN (
    SELECT oid FROM pg_roles WHERE rolname = :'app' OR (oid = 10 AND :'app_is_bootstrap'))
  \gset
  \echo memory-roles: ended :ended session(s) opened as the app role before the change
\endif

\connect - :admin
REASSIGN OWNED BY :"helper" TO :"admin";
DROP OWNED BY :"helper";
DROP ROLE :"helper";
\echo memory-roles: done: :admin is a superuser, :app an ordinary role that owns database :DBNAME
SQL
