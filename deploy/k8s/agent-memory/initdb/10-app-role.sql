-- The memory's app role: an ORDINARY role (no superuser, no BYPASSRLS), so the ledger's
-- row-level security binds it (loopstack/memory/ledger/postgres_schema.py; loopstack/memory/ledger/postgres.py
-- refuses to open as a role it would not bind). It owns the database, so it creates and
-- migrates the tables.
--
-- Run once by the official postgres image's entrypoint (/docker-entrypoint-initdb.d, on an
-- empty data directory only) as the admin POSTGRES_USER, connected to POSTGRES_DB, with:
--   MEMORY_APP_USER      the role the workers log in as (LOOPSTACK_MEMORY_URL's user)
--   MEMORY_APP_PASSWORD  its password (a Secret of its own, never the admin's)
-- A data directory made before this file existed (POSTGRES_USER=loopstack: the app role is
-- the bootstrap superuser and no `postgres` role exists) is NOT fixed by running this file:
-- ../upgrade/memory-roles.sh brings it to this layout (docs/deploy.md, section 9).
\getenv app_user MEMORY_APP_USER
\getenv app_password MEMORY_APP_PASSWORD
\if :{?app_user}
\else
  DO $$ BEGIN RAISE EXCEPTION 'MEMORY_APP_USER is not set'; END $$;
\endif
\if :{?app_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'MEMORY_APP_PASSWORD is not set'; END $$;
\endif

SELECT format(
  'CREATE ROLE %I LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION',
  :'app_user'
) WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app_user') \gexec
-- An existing role (a rerun, or the old superuser "loopstack") is made ordinary too.
SELECT format(
  'ALTER ROLE %I LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION',
  :'app_user'
) \gexec
ALTER ROLE :"app_user" PASSWORD :'app_password';
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'app_user') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()) \gexec
