# aiayn: `make run` = the main job (Multi30k En->De: fetch -> corpus -> prepare -> tokenize -> train -> evaluate
#        -> quantize -> export -> monitor_reference); `make test` = the test suite (what CI runs). Both create
#        the venv first if needed. `make help` lists every target with its `##` comment.
SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3.11
PY := $(abspath $(VENV))/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export PYTHONUNBUFFERED := 1
PYTEST_ARGS ?=
## Test processes (pytest-xdist): the tests are one-threaded, so one per core of the 2-core hosts.
TEST_WORKERS ?= 2
## PyTorch's CPU wheels (requirements.lock pins torch==X+cpu). PyPI's plain torch is the CUDA build,
## which --no-deps would leave without its CUDA libraries ("libcudnn.so.9: cannot open shared object").
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: help install system-deps run adapt test test-fast test-services test-heavy ui clean

$(VENV)/.installed: pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==26.3 setuptools==84.2.1
	$(PY) -m pip install -q --no-compile --no-deps --extra-index-url $(TORCH_INDEX) "$$(grep -o '^torch==[^ ]*' requirements.lock)"
	$(PY) -m pip install -q --no-compile --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-compile --no-deps -e .
	$(PY) -c "import torch, ctranslate2, aiayn" || { echo "the installed packages do not import (see above)"; exit 1; }
	touch $@

## Create .venv from requirements.lock (PyTorch's CPU build from TORCH_INDEX) and check that it imports.
install: $(VENV)/.installed

SYSTEM_PACKAGES := postgresql chromium chromium-driver
## Programs the `services` tests start (Debian packages): PostgreSQL, and Chromium + ChromeDriver for
## the browser test. Installed with apt-get when missing and we are root (CI, containers); otherwise the
## tests that need them are skipped with a message (`sudo make system-deps` installs them).
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "installing$$missing (Debian packages)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	else \
	  echo "note: missing Debian packages:$$missing; the services tests that need them will be skipped (sudo make system-deps installs them)"; \
	fi

## The main job: the Prefect `pipeline` flow = fetch the corpus (download, or copy from
## AIAYN_DATA_MIRROR) -> `dvc repro` (DVC decides what is stale) -> `dvc push` -> report (printed last:
## BLEU/chrF per test set, sacreBLEU signatures, MLflow run, data version; every metric: `dvc metrics show`).
## PARAMS=configs/wmt14_base.yaml: that config is copied over params.yaml first (`git diff` shows it).
run: install
	$(if $(PARAMS),cp $(PARAMS) params.yaml && python -m aiayn.cli.main check &&) python -m pipelines.pipeline

## Adapt the champion to its users' domain (the `adapt` Prefect flow, docs/operations.md): when the trigger fires
## (adapt.trigger; FORCE=1 adapts anyway), train from the champion on the reviewed corpus, then the two-sided
## promotion gate decides. PARAMS=...: that config is copied over params.yaml first, as for `make run`.
adapt: install
	$(if $(PARAMS),cp $(PARAMS) params.yaml && python -m aiayn.cli.main check &&) python -m pipelines.adapt_flow$(if $(FORCE), --force)

## Every CPU tier: unit, slow (whole smoke pipelines), faults (kill -9 in every stage) and services (a real Prefect server). CI runs this.
## Not the `heavy` cases (make test-heavy) nor `gpu`.
## Two processes (tests/conftest.py groups them: a module per process, the services tier together);
## the summary ends with each tier's time and the host's 2-thread matmul GFLOP/s.
test: install system-deps
	$(PY) -m pytest -m "not gpu and not heavy" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

## The quick unit tier (pytest's default markers): for the edit-test loop.
test-fast: install
	$(PY) -m pytest $(PYTEST_ARGS)

## The heavy cases: another corpus, pair or architecture through a whole pipeline (~12 min on 2 cores).
test-heavy: install
	$(PY) -m pytest -m heavy -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

## The services tier alone (a real Prefect server, PostgreSQL, the MLflow UI in Chromium).
test-services: install system-deps
	$(PY) -m pytest -m services $(PYTEST_ARGS)

## Open the MLflow UI on the local store (http://127.0.0.1:5000).
ui: install
	mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

## Remove the pipeline's outputs (artifacts/) and its run state (.aiayn/); the MLflow store and DVC cache stay.
clean:
	rm -rf artifacts .aiayn

## This list: every target and its comment.
help:
	@awk '/^## /{c = c "    " substr($$0, 4) "\n"; next} /^[a-z-]+:/{split($$0, t, ":"); printf "make %s\n%s", t[1], c} {c = ""}' $(firstword $(MAKEFILE_LIST))
