#!/bin/sh
# One-shot job of the minio-init service (image minio/mc): creates the MLflow artifact bucket and
# the DVC remote bucket, and the service account (AIAYN_S3_*) that MLflow and the Prefect worker use,
# with MinIO's built-in `readwrite` policy. Idempotent: safe on every `docker compose up`.
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${MLFLOW_BUCKET:?}" "${DVC_BUCKET:?}"
: "${S3_ACCESS_KEY_ID:?}" "${S3_SECRET_ACCESS_KEY:?}"

mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "local/$MLFLOW_BUCKET" "local/$DVC_BUCKET"
mc admin user add local "$S3_ACCESS_KEY_ID" "$S3_SECRET_ACCESS_KEY"
# `attach` fails when the policy is attached already (a re-run): accept that case only
# (plain shell matching: the mc image is minimal)
if ! mc admin policy attach local readwrite --user "$S3_ACCESS_KEY_ID"; then
  info="$(mc admin user info local "$S3_ACCESS_KEY_ID")"
  case "$info" in
    *readwrite*) echo "minio-init: readwrite was attached already" ;;
    *) echo "minio-init: could not attach readwrite to $S3_ACCESS_KEY_ID" >&2; exit 1 ;;
  esac
fi
echo "minio-init: buckets $MLFLOW_BUCKET and $DVC_BUCKET ready, user $S3_ACCESS_KEY_ID has readwrite"
