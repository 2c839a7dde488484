#!/bin/bash
# Postgres init (docker-entrypoint-initdb.d): one database and one owner role each for MLflow and
# Prefect, from the container's environment (see docker-compose.yml / .env.example).
# The official image runs this ONCE, when the data volume is empty; to change a password later,
# ALTER ROLE by hand (or `docker compose down -v` to start from scratch, losing the data).
# Values go through psql variables (:"ident" / :'literal'), so any password is quoted correctly.
# No `set -u`: when the file is not executable the entrypoint *sources* it (same options as its own).
set -eo pipefail
: "${MLFLOW_DB_USER:?}" "${MLFLOW_DB_PASSWORD:?}" "${PREFECT_DB_USER:?}" "${PREFECT_DB_PASSWORD:?}"

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
  --set=mlflow_user="$MLFLOW_DB_USER" --set=mlflow_password="$MLFLOW_DB_PASSWORD" \
  --set=prefect_user="$PREFECT_DB_USER" --set=prefect_password="$PREFECT_DB_PASSWORD" <<'SQL'
CREATE ROLE :"mlflow_user" LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER :"mlflow_user";
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;

CREATE ROLE :"prefect_user" LOGIN PASSWORD :'prefect_password';
CREATE DATABASE prefect OWNER :"prefect_user";
REVOKE ALL ON DATABASE prefect FROM PUBLIC;

-- Prefect's migrations create pg_trgm (trusted, so the owner could too); create it as superuser anyway.
\connect prefect
CREATE EXTENSION IF NOT EXISTS pg_trgm;
SQL
