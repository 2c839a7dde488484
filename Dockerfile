# syntax=docker/dockerfile:1
# The project image: `mlflow server`, the Prefect worker (runs `dvc repro` / `dvc push` and the drift
# check) and `aiayn serve` all run from it (see docker-compose.yml).
#   docker build -t aiayn .                                  # CPU PyTorch (default)
#   docker build --build-arg TORCH_VARIANT=cu128 -t aiayn .  # a CUDA build of the same torch version
# Installs exactly like the Makefile's `install` target: pinned pip/setuptools, torch from PyTorch's
# index, then the whole pinned closure with --no-deps, then the project itself.
FROM python:3.11-slim

ARG TORCH_VARIANT=cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DO_NOT_TRACK=1 \
    DVC_NO_ANALYTICS=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

# git: DVC needs it at run time (`dvc repro` / `dvc push` in the Prefect worker).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 aiayn \
    && useradd --uid 10001 --gid aiayn --create-home --shell /bin/bash aiayn

WORKDIR /app

# Dependencies first, so editing the code does not reinstall them.
# requirements.lock pins `torch==X+cpu`; the CPU build is installed with --no-deps (as `make install`
# does). Any other variant (cu126, cu128, ...) pins the same X with that local tag and is installed WITH
# its dependencies: the CUDA wheels need the nvidia-* libraries, which the CPU lock does not list.
COPY requirements.lock pyproject.toml ./
RUN set -eux; \
    python -m pip install -q --upgrade pip==26.3 setuptools==84.2.1; \
    torch_version="$(grep -o '^torch==[^ +]*' requirements.lock)"; \
    test -n "$torch_version"; \
    torch_index="https://download.pytorch.org/whl/${TORCH_VARIANT}"; \
    if [ "$TORCH_VARIANT" = cpu ]; then \
        pip install -q --no-compile --no-deps --extra-index-url "$torch_index" "${torch_version}+cpu"; \
    else \
        pip install -q --no-compile --extra-index-url "$torch_index" "${torch_version}+${TORCH_VARIANT}"; \
    fi; \
    grep -v '^torch==' requirements.lock > /tmp/requirements.no-torch.txt; \
    pip install -q --no-compile --no-deps -r /tmp/requirements.no-torch.txt; \
    rm /tmp/requirements.no-torch.txt

# The project, .git included (DVC needs the git repository; see .dockerignore).
COPY --chown=aiayn:aiayn . /app
# Editable: the worker's `dvc repro` runs `python -m pipelines.run_stage ...` in /app, on this same code.
# The folders that docker-compose.yml mounts named volumes on are created here, owned by aiayn, so
# Docker initialises each new (empty) volume with that owner and the non-root user can write it.
RUN set -eux; \
    pip install -q --no-compile --no-deps --no-build-isolation -e .; \
    python -c "import torch, ctranslate2, aiayn, pipelines, monitoring"; \
    mkdir -p /app/serving /app/.dvc/cache; \
    chown -R aiayn:aiayn /app/serving /app/.dvc; \
    find /app -maxdepth 2 -name '*.egg-info' -exec chown -R aiayn:aiayn {} +; \
    chown aiayn:aiayn /app

USER aiayn
EXPOSE 5000 8000
CMD ["aiayn", "--help"]
