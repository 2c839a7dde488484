"""Prefect flows over the real stages, under one session-wide Prefect test harness.

Fast tier: fetch/prepare/tokenize flows on the smoke configuration, retries of a
transient I/O error (and none for other errors), a failing stage failing its flow
with the stage's own message and leaving no partial output, ``python -m
pipelines.run_stage`` exit codes, the report renderer and the deployment table.
Slow tier: the ``pipeline`` flow (``dvc repro`` of all four real stages, push,
markdown artifact) and a pipeline whose stage fails.

Shared projects are only read; a test that runs a stage in one works on a copy (``scratch.copy_project``).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest
import yaml

from pipelines.dag import STAGES

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


@pytest.fixture(scope="session")
def smoke_root(tmp_path_factory, prefect_harness, multi30k_mirror) -> Path:
    """A scratch project on configs/smoke.yaml whose corpus came in through the ``fetch`` flow, built
    once and never changed: a test that runs a stage in it takes ``own_smoke_root``."""
    from pipelines.flows import fetch
    from support.scratch import scratch_project

    root = scratch_project(tmp_path_factory.mktemp("smoke") / "project", SMOKE)
    state = fetch(root=str(root), mirror=str(multi30k_mirror), return_state=True)
    assert state.is_completed(), state.message
    return root


@pytest.fixture
def own_smoke_root(smoke_root, tmp_path) -> Path:
    """A copy of ``smoke_root`` in this test's ``tmp_path`` (``support.scratch.copy_project``)."""
    from support.scratch import copy_project

    return copy_project(smoke_root, tmp_path / "project")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(folder: Path) -> list[str]:
    """Temporary siblings an atomic write would leave behind after a crash."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name) if folder.exists() else []


# --------------------------------------------------------------------------- stage flows


def test_fetch_flow_brings_verified_corpus(smoke_root, multi30k_mirror):
    raw = smoke_root / "data" / "multi30k"
    expected = dict(line.split()[::-1] for line in (multi30k_mirror / "SHA256SUMS").read_text().splitlines() if line.strip())
    for name in ("train.en.gz", "train.de.gz", "test_2017_mscoco.de.gz"):
        assert _sha256(raw / name) == expected[name]


def test_prepare_flow_runs_stage_with_smoke_limits(own_smoke_root):
    from pipelines.flows import prepare

    smoke_root = own_smoke_root
    summary = prepare(root=str(smoke_root))
    cfg = yaml.safe_load(SMOKE.read_text())["data"]
    prepared = smoke_root / "artifacts" / "prepared"
    n_train = len((prepared / "train.en").read_text(encoding="utf-8").splitlines())
    n_test = len((prepared / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines())
    assert n_train == cfg["max_train_pairs"] == summary["train"]["kept"]
    assert n_test == cfg["max_eval_pairs"]
    assert summary["train"]["read"] == 29000  # Multi30k train size (mirror README)


def test_tokenize_flow_then_injected_failure_keeps_previous_output(own_smoke_root, monkeypatch):
    """A stage that dies mid-write fails its flow with its own message and leaves the last good output."""
    import aiayn.stages.tokenize as tokenize_stage
    from pipelines.flows import prepare, tokenize

    smoke_root = own_smoke_root
    prepare(root=str(smoke_root))
    summary = tokenize(root=str(smoke_root))
    out = smoke_root / "artifacts" / "tokenized"
    vocab_size = yaml.safe_load(SMOKE.read_text())["tokenize"]["vocab_size"]
    assert summary["vocab_size"] == vocab_size
    before = {p.name: _sha256(p) for p in out.iterdir()}

    real_save, calls = tokenize_stage.save_encoded, []

    def save_then_fail(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(tokenize_stage, "save_encoded", save_then_fail)
    state = tokenize(root=str(smoke_root), return_state=True)
    assert state.is_failed()
    assert "OSError: disk full (injected)" in state.message
    assert len(calls) == 2  # compute stages are never retried, even on OSError
    assert {p.name: _sha256(p) for p in out.iterdir()} == before
    assert _leftovers(out.parent) == []


def test_stage_failure_fails_flow_with_stage_message(tmp_path, prefect_harness):
    """Prepare without a corpus: the flow fails with exactly the stage's own error text."""
    import aiayn.stages.prepare as prepare_stage
    from aiayn.config.schema import load_params
    from aiayn.stages import Layout
    from pipelines.flows import prepare

    (tmp_path / "params.yaml").write_text(SMOKE.read_text())
    with pytest.raises(Exception) as direct:
        prepare_stage.run(load_params(tmp_path / "params.yaml"), Layout(tmp_path))
    state = prepare(root=str(tmp_path), return_state=True)
    assert state.is_failed()
    assert f"{type(direct.value).__name__}: {direct.value}" in state.message
    assert not (tmp_path / "artifacts" / "prepared").exists()
    assert _leftovers(tmp_path / "artifacts") == []


def test_stage_cli_exit_status_and_error_file(tmp_path, prefect_harness, capsys, monkeypatch):
    from aiayn.config.settings import STAGE_ERROR_FILE_ENV
    from pipelines import run_stage as stage

    (tmp_path / "params.yaml").write_text(SMOKE.read_text())
    error_file = tmp_path / "err.txt"
    monkeypatch.setenv(STAGE_ERROR_FILE_ENV, str(error_file))
    assert stage.main(["prepare", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "stage prepare failed: CorpusError: raw corpus file(s) missing" in err
    assert error_file.read_text().strip() in err
    with pytest.raises(SystemExit) as bad:
        stage.main(["no-such-stage"])
    assert bad.value.code == 2


def test_a_bad_input_under_dvc_is_one_line_not_two_tracebacks(tmp_path, prefect_harness):
    """What ``dvc repro`` runs (``python -m pipelines.run_stage``) on a missing corpus: the stage's own message once, as
    ``aiayn prepare`` says it, without Prefect's task and flow tracebacks (an error of the input, not of the code;
    a bug still gets its traceback, as ``aiayn <stage>`` would)."""
    import os
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_text(SMOKE.read_text())
    env = os.environ | {"PREFECT_API_URL": prefect_harness, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'src'}",
                        "AIAYN_TRACKING": "0"}
    proc = subprocess.run([sys.executable, "-m", "pipelines.run_stage", "prepare", "--root", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "stage prepare failed: CorpusError: raw corpus file(s) missing" in proc.stderr, out
    assert "Traceback" not in out and "NoneType: None" not in out, out
    # once in each place that ends: the task run's final state, the flow run's, the process's last line
    assert out.count("raw corpus file(s) missing") == 3, out
    bad = tmp_path / "bad.yaml"  # params `aiayn check` refuses, found in the flow before the stage runs
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["evaluate"]["beam_size"] = 0
    bad.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "pipelines.run_stage", "prepare", "--root", str(tmp_path), "--params",
                           str(bad)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "stage prepare failed: ConfigError:" in proc.stderr and "beam_size" in out, out
    assert "Traceback" not in out, out


# --------------------------------------------------------------------------- retries


def test_fetch_retries_transient_io_error_then_succeeds(tmp_path, prefect_harness, monkeypatch, multi30k_mirror):
    import aiayn.stages.fetch as fetch_stage
    from pipelines.flows import fetch

    real_run, attempts = fetch_stage.run, []

    def flaky(layout, mirror=None):
        attempts.append(mirror)
        if len(attempts) == 1:
            raise ConnectionResetError("connection reset by peer (injected)")
        return real_run(layout, mirror=mirror)

    monkeypatch.setattr(fetch_stage, "run", flaky)
    summary = fetch(root=str(tmp_path), mirror=str(multi30k_mirror))
    assert len(attempts) == 2
    assert summary["n_files"] == len((multi30k_mirror / "SHA256SUMS").read_text().splitlines())
    assert (tmp_path / "data" / "multi30k" / "SHA256SUMS").is_file()


def test_fetch_does_not_retry_a_checksum_error(tmp_path, prefect_harness, monkeypatch):
    import aiayn.stages.fetch as fetch_stage
    from aiayn.data.readers import CorpusError
    from pipelines.flows import fetch

    attempts = []

    def corrupt(layout, mirror=None):
        attempts.append(1)
        raise CorpusError("checksum mismatch for train.de.gz (injected)")

    monkeypatch.setattr(fetch_stage, "run", corrupt)
    state = fetch(root=str(tmp_path), return_state=True)
    assert state.is_failed() and "checksum mismatch for train.de.gz (injected)" in state.message
    assert len(attempts) == 1


def test_is_transient_covers_network_errors_only():
    import errno
    import urllib.error

    from pipelines.flows import is_transient

    transient = [TimeoutError(), ConnectionResetError("reset"), urllib.error.URLError("x"),
                 urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "refused")),
                 urllib.error.HTTPError("http://x", 503, "unavailable", {}, None),
                 urllib.error.HTTPError("http://x", 429, "slow down", {}, None),
                 OSError(errno.ENETUNREACH, "network is unreachable")]
    permanent = [OSError(errno.ENOSPC, "No space left on device"), PermissionError(errno.EACCES, "Permission denied"),
                 OSError(errno.EROFS, "Read-only file system"), FileNotFoundError(errno.ENOENT, "missing"),
                 urllib.error.HTTPError("http://x", 404, "not found", {}, None), OSError("no errno"),
                 urllib.error.URLError(OSError(errno.ENOSPC, "No space left on device")),
                 ValueError("bad checksum"), None]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device (injected)"),
                                   PermissionError(13, "Permission denied (injected)")])
def test_fetch_does_not_retry_a_full_disk_or_a_permission_error(tmp_path, prefect_harness, monkeypatch, error):
    import aiayn.stages.fetch as fetch_stage
    from pipelines.flows import fetch

    attempts = []

    def broken(layout, mirror=None):
        attempts.append(1)
        raise error

    monkeypatch.setattr(fetch_stage, "run", broken)
    state = fetch(root=str(tmp_path), return_state=True)
    assert state.is_failed() and "(injected)" in state.message
    assert len(attempts) == 1


def test_download_retries_a_reset_but_not_a_full_disk(tmp_path, monkeypatch):
    import urllib.request

    from aiayn.data import multi30k as corpus

    calls = []

    def urlopen(url, timeout):
        calls.append(url)
        raise errors.pop(0)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(corpus.time, "sleep", lambda s: None)
    errors = [ConnectionResetError("reset"), ConnectionResetError("reset"), ConnectionResetError("reset")]
    with pytest.raises(corpus.CorpusError, match="after 3 attempts"):
        corpus._download("http://127.0.0.1:9/x.gz", tmp_path / "x.gz")
    assert len(calls) == 3
    calls.clear()
    errors = [OSError(28, "No space left on device")]
    with pytest.raises(corpus.CorpusError, match="No space left"):
        corpus._download("http://127.0.0.1:9/x.gz", tmp_path / "x.gz")
    assert len(calls) == 1


# --------------------------------------------------------------------------- report, deployments


def test_push_goes_to_the_remote_named_by_the_environment(tmp_path, prefect_harness, monkeypatch):
    """AIAYN_DVC_REMOTE picks the remote (e.g. the team's S3 bucket) without touching .dvc/config;
    a name .dvc/config lacks fails the push instead of silently skipping it."""
    from dvc.repo import Repo
    from prefect import flow

    from aiayn.config.settings import DVC_REMOTE_ENV as REMOTE_ENV
    from pipelines.pipeline import dvc_push

    root = tmp_path / "project"
    root.mkdir()
    (root / "corpus.txt").write_text("a man rides a bike\n")
    monkeypatch.chdir(root)  # DVC resolves the added path against the working directory
    with Repo.init(str(root), no_scm=True) as repo:
        with repo.config.edit() as conf:
            conf["core"]["remote"] = "local"
            conf["remote"]["local"] = {"url": str(tmp_path / "default-remote")}
            conf["remote"]["team"] = {"url": str(tmp_path / "team-remote")}
        repo.add("corpus.txt")

    @flow
    def push_flow() -> dict:
        return dvc_push(str(root))

    monkeypatch.setenv(REMOTE_ENV, "team")
    assert push_flow() == {"pushed": 1, "remote": "team", "reason": None}
    assert any((tmp_path / "team-remote").rglob("*")) and not (tmp_path / "default-remote").exists()
    monkeypatch.setenv(REMOTE_ENV, "no-such-remote")
    state = push_flow(return_state=True)
    assert state.is_failed() and "no-such-remote" in state.message
    monkeypatch.delenv(REMOTE_ENV)
    assert push_flow()["remote"] == "local" and any((tmp_path / "default-remote").rglob("*"))


def test_cluster_deployment_renders_a_gpu_job_manifest_without_a_cluster():
    """The nightly retrain on the Kubernetes pool: the Job a worker would submit, rendered by
    prefect-kubernetes' own job configuration (no cluster, no API: the Prefect client is a stub)."""
    import asyncio
    import uuid
    from unittest import mock

    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    from pipelines.deploy import (
        DEPLOYMENTS, K8S_WORK_POOL, ClusterJob, build_cluster_deployment, cluster_job_variables,
        k8s_base_job_template)

    env = {"MLFLOW_TRACKING_URI": "http://mlflow.aiayn.svc:5000", "AIAYN_DVC_REMOTE": "s3",
           "AWS_ENDPOINT_URL_S3": "http://minio.aiayn.svc:9000", "PREFECT_API_URL": "http://prefect.aiayn.svc:4200/api",
           "AWS_SECRET_ACCESS_KEY": "never-in-a-manifest", "HOME": "/root"}
    job = ClusterJob(image="registry.example/aiayn:cu128", gpus=2, cpu="16", memory="96Gi")
    deployment = build_cluster_deployment(DEPLOYMENTS[0], job, env)
    assert (deployment.name, deployment.work_pool_name, deployment.parameters) == (
        "nightly-gpu", K8S_WORK_POOL, {"root": "/app", "push": True})
    assert [s.schedule.cron for s in deployment.schedules] == ["0 2 * * *"]

    cfg = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        k8s_base_job_template(), deployment.job_variables, client=mock.AsyncMock()))
    cfg.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="nightly-run"))
    manifest = cfg.job_manifest
    assert manifest["kind"] == "Job" and manifest["metadata"]["namespace"] == "aiayn"
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/aiayn:cu128"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["resources"]["requests"] == {"cpu": "16", "memory": "96Gi"}
    assert container["envFrom"] == [{"secretRef": {"name": "aiayn-s3"}}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    got = {e["name"]: e.get("value") for e in container["env"]}
    for k in ("MLFLOW_TRACKING_URI", "AIAYN_DVC_REMOTE", "AWS_ENDPOINT_URL_S3", "PREFECT_API_URL"):
        assert got[k] == env[k]
    assert "AWS_SECRET_ACCESS_KEY" not in got and "HOME" not in got  # credentials come from the Secret only
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI"):  # a pod cannot reach a local SQLite store
        cluster_job_variables(job, {"MLFLOW_TRACKING_URI": "sqlite:///mlflow.db"})


def test_render_report_lists_every_test_set_with_signatures():
    from aiayn.provenance import CorpusInput
    from pipelines.pipeline import render_report

    metrics = {"test_2016_flickr": {"bleu": 35.123, "chrf": 61.0, "bleu_lc_tok": 37.996}, "test_2017_mscoco": {"bleu": 20.0, "chrf": 50.5, "bleu_lc_tok": 21.004}}
    scores = {s: {"bleu_signature": "nrefs:1|case:mixed|tok:13a", "chrf_signature": "nrefs:1|nc:6"} for s in metrics}
    md = render_report(metrics=metrics, scores=scores, data_hashes={"data": "abc.dir", "artifacts/model": "x"},
                       mlflow_link="http://mlflow/#/runs/1", ran=["train"], push={"pushed": 3, "remote": "local", "reason": None})
    assert "| test_2016_flickr | 35.12 | 61.00 | 38.00 |" in md
    assert "| test_2017_mscoco | 20.00 | 50.50 | 21.00 |" in md
    assert "`nrefs:1|case:mixed|tok:13a`" in md and "`nrefs:1|nc:6`" in md
    assert "md5 `abc.dir`" in md and "artifacts/model" not in md
    assert "http://mlflow/#/runs/1" in md and "pushed 3 file(s)" in md
    mine = render_report(metrics=metrics, scores=scores, data_hashes={"data/multi30k": "abc.dir", "corpora/mine": "def.dir"},
                         mlflow_link=None, ran=[], push=None, corpus=CorpusInput("corpora/mine", "def.dir"))  # one's own
    assert "- data `corpora/mine` (the corpus this run read): md5 `def.dir`" in mine and "abc.dir" not in mine
    md = render_report(metrics=None, scores=None, data_hashes={}, mlflow_link=None, ran=[], push={"pushed": None, "remote": None, "reason": "no remote"})
    assert "No evaluation metrics" in md and "not pushed (no remote)" in md and "nothing (all stages up to date)" in md


def test_deployment_table_builds_nightly_cron_on_the_work_pool(tmp_path):
    from pipelines.deploy import DEPLOYMENTS, WORK_POOL, DeploymentSpec, build_deployments

    (nightly,) = [d for d in build_deployments(tmp_path) if d.name == "nightly"]
    assert nightly.flow_name == "pipeline" and nightly.work_pool_name == WORK_POOL
    assert nightly.entrypoint == "pipelines.pipeline.pipeline"
    assert nightly.parameters["root"] == str(tmp_path.resolve())
    assert nightly.job_variables == {"working_dir": str(tmp_path.resolve())}
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "UTC"
    assert len({d.name for d in DEPLOYMENTS}) == len(DEPLOYMENTS)
    (served,) = [d for d in build_deployments(tmp_path, work_pool=None) if d.name == "nightly"]
    assert served.work_pool_name is None and not served.job_variables  # `serve`: no pool, no worker
    with pytest.raises(ValueError, match="not both"):
        DeploymentSpec(name="x", flow="m:f", description="", cron="* * * * *", interval_s=60)
    with pytest.raises(ValueError, match="set at deploy time"):
        DeploymentSpec(name="x", flow="m:f", description="", parameters={"root": "/elsewhere"})


def test_deploy_list_prints_the_schedule(capsys):
    from pipelines.deploy import WORK_POOL, main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"work pool: {WORK_POOL} (process)" in out and "pipeline/nightly: cron '0 2 * * *' UTC" in out
    assert "drift-check/hourly: cron '0 * * * *' UTC; at most 1 running (CANCEL_NEW on collision)" in out


def test_hourly_drift_check_deployment_cancels_new_runs_while_one_runs(tmp_path):
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    from pipelines.deploy import DeploymentSpec, build_deployments

    (hourly,) = [d for d in build_deployments(tmp_path) if d.name == "hourly"]
    assert hourly.flow_name == "drift-check" and hourly.entrypoint == "pipelines.drift_flow.drift"
    (schedule,) = hourly.schedules
    assert schedule.schedule.cron == "0 * * * *" and schedule.schedule.timezone == "UTC"
    assert hourly.concurrency_limit == 1
    assert hourly.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.CANCEL_NEW
    (nightly,) = [d for d in build_deployments(tmp_path) if d.name == "nightly"]
    assert nightly.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.ENQUEUE
    with pytest.raises(ValueError, match="collision_strategy"):
        DeploymentSpec(name="x", flow="m:f", description="", collision_strategy="DROP")


# --------------------------------------------------------------------------- slow: the whole pipeline


@pytest.mark.slow
def test_pipeline_flow_reproduces_pushes_and_reports(smoke_pipeline, prefect_harness, tmp_path):
    """The session's smoke pipeline (tests/conftest.py) ran every stage through the ``pipeline`` flow,
    pushed, nested its MLflow runs and published its report; run again, it does nothing."""
    import json

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from pipelines.pipeline import REPORT_KEY, pipeline

    root, result = smoke_pipeline["root"], smoke_pipeline["result"]
    assert result["ran"] == list(STAGES)
    assert result["push"]["pushed"] > 0
    (data_out,) = yaml.safe_load((REPO / "data.dvc").read_text())["outs"]
    assert result["data"] == {"data.dvc": "cached"}  # fetched corpus == the versioned one
    assert f"md5 `{data_out['md5']}`" in result["report"]
    (timing,) = [x for x in result["report"].splitlines() if x.startswith("- time: DVC stages ")]
    assert " GFLOP/s before, " in timing and " on host: " in timing  # the host beside the run's timing
    md5 = data_out["md5"]
    assert (root / ".dvc-remote" / "files" / "md5" / md5[:2] / md5[2:]).is_file()  # raw corpus pushed
    metrics = json.loads((root / "artifacts" / "eval_metrics.json").read_text())
    for split, m in metrics.items():
        assert f"| {split} | {m['bleu']:.2f} | {m['chrf']:.2f} | {m['bleu_lc_tok']:.2f} |" in result["report"]
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    assert set(lock["stages"]) == set(STAGES)

    from mlflow import MlflowClient  # the stages' MLflow runs nest under this pipeline run's parent

    parent = result["mlflow_run"]
    assert parent and parent in result["report"]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert {r.info.run_name for r in children} >= {"train", "evaluate", "orchestrate"}
    assert all(r.info.status == "FINISHED" for r in children) and client.get_run(parent).info.status == "FINISHED"
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[REPORT_KEY])))
    assert any(a.type == "markdown" and a.data == result["report"] for a in artifacts)

    from support.scratch import copy_project

    # run again (it records runs and a report: on a copy, so the shared project stays as it was built)
    copy = copy_project(root, tmp_path / "project")
    env = {k: smoke_pipeline["env"][k] for k in ("OMP_NUM_THREADS", "AIAYN_DATA_MIRROR")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        again = pipeline(root=str(copy), push=False)  # nothing changed: DVC runs nothing
    assert again["ran"] == [] and again["push"] is None and again["data"] == {"data.dvc": "up to date"}


@pytest.mark.slow
def test_pipeline_fails_with_the_failing_stage_message(tmp_path, prefect_harness, multi30k_mirror, monkeypatch):
    """A config problem stops the flow before any stage (``aiayn check``); a problem only the
    data shows (a misaligned corpus) fails its stage, and the flow's message names the stage and the files."""
    from pipelines.pipeline import pipeline
    from support.scratch import scratch_project

    monkeypatch.setenv("AIAYN_TRACKING", "0")
    bad = tmp_path / "bad.yaml"
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["data"]["test_splits"] = ["test_2099_missing"]
    bad.write_text(yaml.safe_dump(cfg))
    root = scratch_project(tmp_path / "project", bad)
    state = pipeline(root=str(root), mirror=str(multi30k_mirror), push=False, return_state=True)
    assert state.is_failed()
    assert "multi30k has no split test_2099_missing for en-de" in state.message and "aiayn check" in state.message
    assert not (root / "artifacts" / "prepared").exists()

    lines = {lang: gzip.decompress((multi30k_mirror / f"train.{lang}.gz").read_bytes()).decode().splitlines()
             for lang in ("en", "de")}
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["data"] |= {"corpus": {"kind": "moses", "path": "corpora/misaligned"}, "train_split": "train",
                    "valid_split": "val", "test_splits": ["test"]}
    cfg.setdefault("quantize", {})["gate_split"] = "test"
    bad.write_text(yaml.safe_dump(cfg))
    root = scratch_project(tmp_path / "mine", bad)
    corpus = root / "corpora" / "misaligned"
    corpus.mkdir(parents=True)
    for split, (a, b) in {"train": (0, 200), "val": (200, 240), "test": (240, 280)}.items():
        for lang, text in lines.items():
            kept = text[a:b - 1] if (split, lang) == ("train", "de") else text[a:b]  # train.de one line short
            (corpus / f"{split}.{lang}").write_text("".join(t + "\n" for t in kept), encoding="utf-8")
    state = pipeline(root=str(root), push=False, return_state=True)
    assert state.is_failed()
    assert "StageFailedError: stage prepare failed: CorpusError: misaligned corpus" in state.message, state.message
    assert "train.en" in state.message and "train.de" in state.message and "199" in state.message
    assert not (root / "artifacts" / "prepared").exists()


# --------------------------------------------------------------------------- bare environment, Ctrl-C


def _bare_env(home: Path) -> dict[str, str]:
    """What a plain shell gives `dvc repro`: no Makefile exports, no Prefect settings, a fresh home."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "AIAYN_TRACKING": "0", "OMP_NUM_THREADS": "1"}


def test_project_settings_apply_without_the_makefile(tmp_path):
    import subprocess
    import sys

    code = ("import pipelines.flows; from prefect.settings import get_current_settings as g; s = g(); "
            "print(s.server.analytics_enabled, s.server.ephemeral.startup_timeout_seconds)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_bare_env(tmp_path), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "120"]


def test_temporary_api_runs_in_its_own_session_and_dies_with_its_flow_process(tmp_path):
    """The temporary API a flow process starts is out of the terminal's process group (so Ctrl-C
    reaches the flow only) and still does not outlive a SIGKILLed flow process (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    code = ("import time, pipelines; pipelines.apply_project_env()\n"
            "from prefect import flow\n"
            "flow(lambda: 1, name='one')()\n"
            "print('FLOW DONE', flush=True); time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_bare_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "FLOW DONE" in line:
                break
        assert "FLOW DONE" in "".join(lines), "".join(lines)[-3000:]
        servers = [c for c in psutil.Process(proc.pid).children() if "uvicorn" in " ".join(c.cmdline())]
        assert len(servers) == 1, [c.cmdline() for c in psutil.Process(proc.pid).children()]
        server = servers[0]
        assert os.getsid(server.pid) != os.getsid(proc.pid)  # a group signal to the flow's group misses it
        proc.kill()  # SIGKILL: no atexit, no Prefect clean-up
        proc.wait(30)
        deadline = time.monotonic() + 30
        while server.is_running() and server.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, "the temporary API outlived its flow"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("to", ["stage", "group"])
def test_stage_from_a_bare_environment_then_ctrl_c_in_train(tmp_path, own_smoke_root, to):
    """`python -m pipelines.run_stage` cold-starts Prefect's temporary API from a plain shell; Ctrl-C in
    train exits 130 with one line naming the checkpoint, and no traceback. ``group``: the SIGINT goes
    to the whole process group, as a terminal's Ctrl-C (or ``kill -INT -PGID``) does, so Prefect's
    temporary API server, a child of the stage, stops at the same moment; the stage must still exit
    (it used to hang for ever in Prefect's at-exit drain of events the dead server would never take)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pipelines.flows import prepare, tokenize

    smoke_root = own_smoke_root
    prepare(root=str(smoke_root))
    tokenize(root=str(smoke_root))
    long = yaml.safe_load((smoke_root / "params.yaml").read_text())
    long["train"].update(max_steps=100_000, log_every=1, checkpoint_every=100_000, validate_every=100_000)
    (smoke_root / "long.yaml").write_text(yaml.safe_dump(long))
    cmd = [sys.executable, "-m", "pipelines.run_stage", "train", "--params", "long.yaml", "--root", str(smoke_root)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines, deadline = [], time.monotonic() + 900  # bounds a hang only: a cold start on a loaded host is slow
    try:
        for line in proc.stdout:  # wait until the loop has taken a few steps
            lines.append(line)
            if "step 3/" in line or time.monotonic() > deadline:
                break
        assert any("step 3/" in line for line in lines), "".join(lines)[-3000:]
        if to == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "NoneType: None" not in out, out[-3000:]
    final = [line for line in out.splitlines() if line.startswith("stage train interrupted")]
    assert len(final) == 1 and "checkpoint saved in" in final[0], out[-3000:]
    assert out.count("checkpoint saved in") == 3, out[-3000:]  # task state, flow state, last line
    assert list((smoke_root / "artifacts" / "checkpoints").glob("ckpt_*.json"))


def test_render_report_opens_with_a_cut_budget():
    """A run cut by the clock says so in the report's first line; a complete one says how it ended."""
    from pipelines.pipeline import render_report

    common = dict(metrics=None, scores=None, data_hashes={}, mlflow_link=None, ran=[], push=None)
    cut = {"budget": "CUT by max_time_s at step 1590 of max_steps 2600: training did not finish",
           "selection": {"kind": "single", "method": "average_last", "replaced": True}}
    md = render_report(**common, training=cut)
    assert md.splitlines()[0] == "> **WARNING: training CUT by max_time_s at step 1590 of max_steps 2600: training did not finish**"
    assert "a single checkpoint (average_last, replaced by the validated choice)" in md
    md = render_report(**common, training={"budget": "complete: max_steps 2600 reached"})
    assert md.splitlines()[0].startswith("# ") and "Training: complete: max_steps 2600 reached" in md


@pytest.mark.parametrize("budget, status", [("CUT by max_time_s at step 1576 of max_steps 1900: training did not finish", 3),
                                            ("complete: max_steps 1900 reached", 0), (None, 0)])
def test_pipeline_exit_status_says_when_training_was_cut(monkeypatch, capsys, budget, status):
    """A run cut by the clock is a failure (developers' guide): ``python -m pipelines.pipeline`` (``make run``)
    prints its report, then exits 3 with the cut on stderr, so ``make run && ...`` stops there; the flow run
    itself ends Failed (a scheduled run that was cut shows as failed), holding the summary."""
    import pipelines.pipeline as pp

    from prefect.states import Completed, State

    summary = {"report": "# report", "training_budget": budget}
    returned = pp.final_result(summary)  # what the flow returns; Prefect makes a returned state the run's state
    assert isinstance(returned, State) == (status == 3)
    if status == 3:
        assert returned.is_failed() and returned.message.startswith("training was CUT by max_time_s at step 1576")

    def flow(**kw) -> State:
        return returned if isinstance(returned, State) else Completed(data=returned)

    flow.description = pp.pipeline.description
    monkeypatch.setattr(pp, "pipeline", flow)
    assert pp.main(["--root", "."]) == status
    out, err = capsys.readouterr()
    assert out.startswith("# report")
    assert ("training was CUT by max_time_s at step 1576" in err) == (status == 3)


def test_render_report_puts_the_host_beside_the_timing():
    """Every timing carries the host's line (developers' guide: hosts of one kind differ ~2x): the report
    gives the DVC stages' wall time with the host and its 2-thread matmul GFLOP/s before and after."""
    from pipelines.pipeline import render_report

    common = dict(metrics=None, scores=None, data_hashes={}, mlflow_link=None, ran=["train"], push=None)
    timing = {"repro_s": 1935.04, "host": "host: AMD EPYC, 2 cores, ISA avx2 fma, 2-thread fp32 matmul 145 GFLOP/s",
              "gflops_after": 131.6}
    md = render_report(**common, timing=timing)
    (line,) = [x for x in md.splitlines() if x.startswith("- time:")]
    assert line == ("- time: DVC stages 1935 s (32.3 min) on host: AMD EPYC, 2 cores, ISA avx2 fma, "
                    "2-thread fp32 matmul 145 GFLOP/s before, 132 after")
    assert not [x for x in render_report(**common).splitlines() if x.startswith("- time:")]
