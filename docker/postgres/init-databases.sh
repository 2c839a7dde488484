#!/bin/bash
# Postgres init (docker-entrypoint-initdb.d): one database and one owner role each for MLflow,
# Prefect and the serving request log (`aiayn serve` replicas), from the container's environment (see docker-compose.yml / .env.example).
# The official image runs this ONCE, when the data volume is empty; to change a password later,
# ALTER ROLE by hand (or `docker compose down -v` to start from scratch, losing the data).
# Values go through psql variables (:"ident" / :'literal'), so any password is quoted correctly.
# No `set -u`: when the file is not executable the entrypoint *sources* it (same options as its own).
set -eo pipefail
: "${MLFLOW_DB_USER:?}" "${MLFLOW_DB_PASSWORD:?}" "${PREFECT_DB_USER:?}" "${PREFECT_DB_PASSWORD:?}"
: "${SERVING_DB_USER:?}" "${SERVING_DB_PASSWORD:?}"

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
  --set=mlflow_user="$MLFLOW_DB_USER" --set=mlflow_password="$MLFLOW_DB_PASSWORD" \
  --set=prefect_user="$PREFECT_DB_USER" --set=prefect_password="$PREFECT_DB_PASSWORD" \
  --set=serving_user="$SERVING_DB_USER" --set=serving_password="$SERVING_DB_PASSWORD" <<'SQL'
CREATE ROLE :"mlflow_user" LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER :"mlflow_user";
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;

CREATE ROLE :"prefect_user" LOGIN PASSWORD :'prefect_password';
CREATE DATABASE prefect OWNER :"prefect_user";
REVOKE ALL ON DATABASE prefect FROM PUBLIC;

-- the request log of the serve replicas (aiayn.serving.request_log creates its tables on first start)
CREATE ROLE :"serving_user" LOGIN PASSWORD :'serving_password';
CREATE DATABASE serving OWNER :"serving_user";
REVOKE ALL ON DATABASE serving FROM PUBLIC;

-- Prefect's migrations create pg_trgm (trusted, so the owner could too); create it as superuser anyway.
\connect prefect
CREATE EXTENSION IF NOT EXISTS pg_trgm;
SQL
