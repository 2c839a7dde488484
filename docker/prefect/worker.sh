#!/bin/sh
# Command of the prefect-worker service (runs in our image, in the project root /app):
#  1. point the DVC remote named $AIAYN_DVC_REMOTE at the MinIO bucket $DVC_BUCKET, in
#     .dvc/config.local (git-ignored; the endpoint comes from AWS_ENDPOINT_URL_S3, which botocore/s3fs read);
#  2. register the deployments (pipeline/nightly, drift-check/hourly) and create the work pool;
#  3. start the process worker on that pool, with its health endpoint (PREFECT_WORKER_WEBSERVER_*).
set -eu
cd /app
: "${AIAYN_DVC_REMOTE:?}" "${DVC_BUCKET:?}"
dvc remote add --local --force "$AIAYN_DVC_REMOTE" "s3://$DVC_BUCKET"
python -m pipelines.deploy deploy --root /app
exec prefect worker start --pool aiayn-process --type process --with-healthcheck
