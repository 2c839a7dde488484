"""Integration (``services`` tier): the smoke pipeline against real services, as a team runs it.

One stack per module, each piece a real program on a free loopback port (``tests/services.py``):
PostgreSQL (backend of MLflow AND Prefect), an S3 endpoint (moto; stands in for MinIO), ``mlflow
server`` on Postgres proxying artifacts to S3 (``--serve-artifacts``), ``prefect server`` on Postgres
with its UI. The pipeline is pointed at them by environment variables only (``MLFLOW_TRACKING_URI``,
``PREFECT_API_URL``, ``AIAYN_DVC_REMOTE`` + the AWS variables for DVC's S3 remote); then:

- the run, its metrics, datasets and registered model through MLflow's API, the flow runs and the
  report artifact through Prefect's API;
- ``dvc pull`` from S3 into a fresh copy of the project restores identical files;
- a client with NO S3 credentials logs, registers and loads ``models:/aiayn-en-de@champion``;
- Postgres, the S3 endpoint and the MLflow server stopped and started on the same data: the alias and
  its artifacts still resolve;
- the MLflow UI and the Prefect UI in headless Chromium show the run, its BLEU, dataset and model, the
  ``champion`` alias, the flow run and the report (screenshots in ``test-output/screens/``).

Takes ~4-6 minutes on 2 cores (most of it the smoke pipeline).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.services import S3_ENV, MlflowServer, Postgres, PrefectServer, S3, require, tail

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
SCREENS = REPO / "test-output" / "screens"
MLFLOW_BUCKET, DVC_BUCKET = "mlflow-artifacts", "aiayn-dvc"  # DVC_BUCKET: the `s3` remote of .dvc/config
MODEL, GATE = "aiayn-en-de", "test_2016_flickr"
PIPELINE_TIMEOUT_S = 1500


def _without_s3_credentials(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("AWS_") and k != "MLFLOW_S3_ENDPOINT_URL"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Postgres + S3 + MLflow server + Prefect server (UI on); all stopped at the end."""
    root = tmp_path_factory.mktemp("stack")
    pg = Postgres(root / "postgres")
    s3 = S3(root / "s3")
    mlflow = MlflowServer(root / "mlflow", backend_store_uri=pg.url("mlflow"),
                          artifacts_destination=f"s3://{MLFLOW_BUCKET}/",
                          env={**S3_ENV, "MLFLOW_S3_ENDPOINT_URL": s3.url})
    prefect = PrefectServer(root / "prefect", database_url=pg.url("prefect", driver="asyncpg"), ui=True)
    try:
        pg.start()
        for db in ("mlflow", "prefect"):
            pg.create_database(db)
        s3.start()
        for bucket in (MLFLOW_BUCKET, DVC_BUCKET):
            s3.client().create_bucket(Bucket=bucket)
        mlflow.start()
        prefect.start()
        yield {"pg": pg, "s3": s3, "mlflow": mlflow, "prefect": prefect}
    finally:
        for service in (prefect, mlflow, s3):
            service.stop()
        pg.remove()


@pytest.fixture(scope="module")
def pipeline_run(stack, tmp_path_factory, multi30k_mirror):
    """The smoke pipeline (``python -m pipelines.pipeline``) against the stack, configured by env only."""
    from support.scratch import scratch_project

    project = scratch_project(tmp_path_factory.mktemp("real") / "project", SMOKE)
    env = {**_without_s3_credentials(dict(os.environ)),
           "MLFLOW_TRACKING_URI": stack["mlflow"].url,
           "PREFECT_API_URL": stack["prefect"].api_url,
           "AIAYN_DVC_REMOTE": "s3", **S3_ENV, "AWS_ENDPOINT_URL_S3": stack["s3"].url,
           "AIAYN_DATA_MIRROR": str(multi30k_mirror), "OMP_NUM_THREADS": "1"}
    env.pop("AIAYN_PARENT_RUN_ID", None)
    log = project.parent / "pipeline.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "pipelines.pipeline"], cwd=project, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=PIPELINE_TIMEOUT_S)
    assert proc.returncode == 0, tail(log, 80)
    return {"project": project, "env": env, "log": log}


def _client(stack):
    from mlflow import MlflowClient

    url = stack["mlflow"].url
    return MlflowClient(tracking_uri=url, registry_uri=url)


def _pipeline_parent(client):
    exp = client.get_experiment_by_name("aiayn")
    runs = client.search_runs([exp.experiment_id], "tags.`aiayn.kind` = 'pipeline'", order_by=["attributes.start_time ASC"])
    assert runs, "no pipeline run"
    return exp, runs[0]  # the smoke pipeline's (a later test registers from a second, export-only run)


def test_mlflow_server_has_the_run_metrics_datasets_and_model(stack, pipeline_run):
    client = _client(stack)
    project = pipeline_run["project"]
    exp, parent = _pipeline_parent(client)
    assert exp.artifact_location.startswith("mlflow-artifacts:/")  # proxied: clients need no S3 credentials
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert parent.info.status == "FINISHED"
    scores = json.loads((project / "artifacts" / "eval_metrics.json").read_text())
    for split, m in scores.items():  # the headline numbers are on the pipeline run itself
        assert parent.data.metrics[f"{split}.bleu"] == pytest.approx(m["bleu"])
        assert parent.data.metrics[f"{split}.chrf"] == pytest.approx(m["chrf"])
    assert "averaged_valid_loss" in parent.data.metrics and parent.data.params["model.d_model"]
    datasets = {i.dataset.name: i.dataset.digest for i in parent.inputs.dataset_inputs}
    train_en = project / "artifacts" / "prepared" / "train.en"
    assert datasets["train.en"] == hashlib.md5(train_en.read_bytes()).hexdigest()
    assert {"data/multi30k", "val.de", f"{GATE}.en"} <= set(datasets)  # data.dvc's output, by its path
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {r.info.run_name for r in children} >= {"train", "evaluate", "quantize", "export"}

    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.source.startswith("models:/m-")
    model_id = champion.source.removeprefix("models:/")
    assert model_id in [o.model_id for o in parent.outputs.model_outputs]
    assert client.get_logged_model(model_id).artifact_location.startswith("mlflow-artifacts:/")
    # the tag is the SERVED variant's BLEU (aiayn.stages.export: the bundle's model card, the float model's BLEU
    # plus that variant's bleu_delta), exactly; the quantize gate accepted that variant, so it lost at most
    # quantize.max_bleu_drop (0.5 in smoke.yaml) on GATE. A gain is not bounded by anything
    from aiayn.config.schema import load_params

    card = json.loads((project / "artifacts" / "export" / "model_card.json").read_text())
    tag, max_drop = float(champion.tags[f"bleu.{GATE}"]), load_params(project / "params.yaml").quantize.max_bleu_drop
    assert tag == float(card["scores"][GATE]["bleu"]) and tag >= scores[GATE]["bleu"] - max_drop
    # the served variant's BLEU has its own key; `<split>.bleu` stays evaluate's (one value, never replaced)
    assert [m.value for m in client.get_metric_history(parent.info.run_id, f"{GATE}.bleu")] == [scores[GATE]["bleu"]]
    assert f"serving.{GATE}.bleu" in parent.data.metrics


def test_prefect_server_has_the_flow_runs_and_report(stack, pipeline_run):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from pipelines.dag import STAGES
    from pipelines.pipeline import REPORT_KEY

    with SyncPrefectClient(stack["prefect"].api_url) as client:
        runs = client.read_flow_runs()
        names = sorted(client.read_flow(r.flow_id).name for r in runs)
        assert names == sorted(["pipeline", "fetch", *STAGES]) or names == sorted(["pipeline", *STAGES]), names
        assert all(r.state.is_completed() for r in runs), [(r.name, r.state.type) for r in runs]
        report = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[REPORT_KEY])))
    assert len(report) == 1 and f"| {GATE} |" in report[0].data


def test_dvc_pull_into_a_fresh_copy_restores_identical_files(stack, pipeline_run, tmp_path):
    import yaml
    from dvc.repo import Repo

    project, env = pipeline_run["project"], pipeline_run["env"]
    keys = [o["Key"] for o in stack["s3"].client().list_objects_v2(Bucket=DVC_BUCKET).get("Contents", [])]
    assert keys, "nothing was pushed to the S3 remote"

    fresh = tmp_path / "fresh"  # what a clone holds: the versioned files, no cache, no outputs
    fresh.mkdir()
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", "data.dvc"):
        shutil.copyfile(project / name, fresh / name)
    (fresh / ".dvc").mkdir()
    shutil.copyfile(project / ".dvc" / "config", fresh / ".dvc" / "config")
    for code in ("src", "monitoring"):  # the stages' code deps, in git
        shutil.copytree(project / code, fresh / code)
    r = subprocess.run([str(Path(sys.executable).parent / "dvc"), "pull", "-r", "s3"], cwd=fresh, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

    lock = yaml.safe_load((project / "dvc.lock").read_text())
    # outputs DVC leaves to git (cache: false): metrics, and the per-step plot tables among the outs
    uncached = {path for s in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].values()
                for kind in ("outs", "metrics", "plots") for m in s.get(kind, []) if isinstance(m, dict)
                for path, o in m.items() if (o or {}).get("cache") is False}
    outs = [o["path"] for s in lock["stages"].values() for o in s.get("outs", []) if o["path"] not in uncached]
    outs += [o["path"] for o in yaml.safe_load((project / "data.dvc").read_text())["outs"]]
    assert "artifacts/model" in outs and "artifacts/export" in outs
    for out in outs:
        a, b = project / out, fresh / out
        files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()) if a.is_dir() else [""]
        assert files == (sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
                         if b.is_dir() else [""]), out
        for f in files:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f"{out}/{f}"
    for path in uncached:  # small metrics and plot files DVC leaves to git (cache: false)
        (fresh / path).parent.mkdir(parents=True, exist_ok=True)
        (fresh / path).write_bytes((project / path).read_bytes())
    with Repo(str(fresh)) as repo:
        assert not repo.status()  # every stage up to date in the fresh copy


NO_CREDS_CLIENT = r"""
import json, sys
from pathlib import Path
import mlflow.pyfunc
from aiayn.inference.artifacts import read_bundle_info
from aiayn.inference.load import BundlePredictor
from aiayn.export.bundle import register_bundle
from aiayn.tracking import Tracker

project, url, action = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
bundle = project / "artifacts" / "export"
sentences = ["A man is riding a bicycle .", "Two dogs play in the snow ."]
out = {}
if action == "register":
    # the champion's own BLEU tag (the served variant's score, which an int8 variant may not share with
    # eval_metrics.json's float score): a tie, which moves the alias
    bleu = float(mlflow.MlflowClient(url).get_model_version_by_alias("aiayn-en-de", "champion").tags["bleu.test_2016_flickr"])
    with Tracker("export", project_root=project, tracking_uri=url, end_pipeline=True) as t:
        out["registered"] = register_bundle(t, bundle, name="aiayn-en-de", variant=read_bundle_info(bundle)["variant"],
                                            gate_split="test_2016_flickr", bleu=bleu, example=sentences[:1])
mlflow.set_tracking_uri(url)
model = mlflow.pyfunc.load_model("models:/aiayn-en-de@champion")
out["served"] = list(model.predict(sentences))
out["direct"] = BundlePredictor(bundle).translate(sentences)
print(json.dumps(out))
"""


def _no_creds_client(stack, pipeline_run, action: str) -> dict:
    env = _without_s3_credentials(pipeline_run["env"])
    assert not any(k.startswith("AWS_") for k in env)
    r = subprocess.run([sys.executable, "-c", NO_CREDS_CLIENT, str(pipeline_run["project"]), stack["mlflow"].url, action],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_client_without_s3_credentials_logs_registers_and_loads(stack, pipeline_run):
    out = _no_creds_client(stack, pipeline_run, "register")
    assert out["registered"] is not None, "registration through the server failed (see stderr)"
    assert out["registered"]["version"] == "2" and out["registered"]["alias"] == "champion"  # same BLEU: a tie moves it
    assert out["served"] == out["direct"] and all(out["served"])


def test_alias_and_artifacts_survive_a_restart_of_postgres_s3_and_mlflow(stack, pipeline_run):
    client = _client(stack)
    before = client.get_model_version_by_alias(MODEL, "champion").version
    for name in ("mlflow", "s3", "pg"):
        stack[name].stop()
    for name in ("pg", "s3", "mlflow"):
        stack[name].start()
    assert client.get_model_version_by_alias(MODEL, "champion").version == before
    out = _no_creds_client(stack, pipeline_run, "load")
    assert out["served"] == out["direct"] and all(out["served"])


def test_mlflow_and_prefect_uis_in_a_browser(stack, pipeline_run):
    require("chromium", hint="install Debian's chromium and chromium-driver (make system-deps)")
    require("chromedriver", hint="install Debian's chromium-driver (make system-deps)")
    from support.browser import chromium
    from support.mlflow_ui import check_mlflow_ui
    from support.prefect_ui import check_prefect_ui
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from pipelines.pipeline import REPORT_KEY

    client = _client(stack)
    exp, parent = _pipeline_parent(client)
    with SyncPrefectClient(stack["prefect"].api_url) as pc:
        flow_run = next(r for r in pc.read_flow_runs() if pc.read_flow(r.flow_id).name == "pipeline")
        assert pc.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[REPORT_KEY])))
    SCREENS.mkdir(parents=True, exist_ok=True)
    with chromium(SCREENS) as driver:
        seen = check_mlflow_ui(driver, stack["mlflow"].url, experiment_name="aiayn", parent_run_id=parent.info.run_id,
                               parent_run_name=parent.info.run_name, metric_key=f"{GATE}.bleu",
                               metric_value=parent.data.metrics[f"{GATE}.bleu"], dataset_name="train.en",
                               model_name=MODEL, alias="champion", screens=SCREENS)
        print("MLflow UI:", seen)
        with pytest.raises(AssertionError):  # the check can fail: a metric the run does not have
            check_mlflow_ui(driver, stack["mlflow"].url, experiment_name="aiayn", parent_run_id=parent.info.run_id,
                            parent_run_name=parent.info.run_name, metric_key="no_such.bleu", metric_value=1.0,
                            dataset_name="train.en", model_name=MODEL, alias="champion", screens=SCREENS / "negative",
                            timeout_s=10)
        seen = check_prefect_ui(driver, stack["prefect"].url, flow_run_id=str(flow_run.id), flow_run_name=flow_run.name,
                                artifact_key=REPORT_KEY, screens=SCREENS)
        print("Prefect UI:", seen)
    assert (SCREENS / "mlflow-experiment-runs.png").stat().st_size > 10_000
