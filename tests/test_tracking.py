"""aiayn.tracking against a real (temporary) SQLite MLflow store, with the stages' own ``StageRecord`` s.

One store per module (creating its tables costs seconds); each test uses its own
project root, so its pipeline state file is its own.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiayn import tracking
from aiayn.config.schema import load_params
from aiayn.provenance import dvc_data_hashes, git_commit
from aiayn.recording import StageRecord
from aiayn.stages import Layout, split_reads
from aiayn.tracking import STATE_FILE, Tracker, end_pipeline_run, resolve_tracking_uri
from pipelines.dag import STAGES, stage_module

from mlflow import MlflowClient  # noqa: E402


def stage_record(stage: str) -> StageRecord:
    """The ``RECORD`` the stage's module opens its run with (a bare record for a stage that has none)."""
    import importlib

    return getattr(importlib.import_module(stage_module(stage)), "RECORD", StageRecord(stage))


def register_model(tracker: Tracker, model_dir_or_artifact_path: str | Path, name: str,
                   alias: str | None = None) -> str | None:
    """Register a model version in the MLflow Model Registry from ``tracker``'s run (test scaffolding).

    ``model_dir_or_artifact_path`` is either a local file/directory, which is
    first uploaded to this run's artifacts under ``registered/<name>``, or an
    artifact path already logged on this run. Creates the registered model
    ``name`` if needed, a version whose source is ``runs:/<run_id>/<path>``,
    and points ``alias`` (e.g. ``"champion"``) at it. Returns the new version
    number as a string, or None when tracking is off.
    """
    from mlflow.exceptions import MlflowException

    if not tracker.active:
        return None
    local = Path(model_dir_or_artifact_path)
    if local.exists():
        artifact_path = f"registered/{name}"
        if local.is_dir():
            tracker.log_artifacts(local, artifact_path)
        else:
            tracker.log_artifact(local, artifact_path)
    else:
        artifact_path = str(model_dir_or_artifact_path).strip("/")

    def register() -> str:
        client = tracker._client
        try:
            client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        mv = client.create_model_version(name, source=f"runs:/{tracker.run_id}/{artifact_path}", run_id=tracker.run_id)
        if alias:
            client.set_registered_model_alias(name, alias, mv.version)
        return str(mv.version)

    return tracker._guard(register)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    d = tmp_path_factory.mktemp("mlflow_store")
    return f"sqlite:///{(d / 'mlflow.db').as_posix()}", d


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # anything written relative to CWD would land here


@pytest.fixture
def client(store: tuple[str, Path]) -> MlflowClient:
    return MlflowClient(tracking_uri=store[0])


def _tracker(stage: str | StageRecord, root: Path, store: tuple[str, Path], **kw) -> Tracker:
    record = stage if isinstance(stage, StageRecord) else stage_record(stage)
    return Tracker(record, project_root=root, tracking_uri=store[0], **kw)


def _aiayn_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("aiayn") and r.levelno == logging.WARNING]


# ----------------------------------------------------------------- params, metrics, artifacts


def test_params_metrics_artifacts_land(tmp_path: Path, store, client: MlflowClient) -> None:
    rng = random.Random(1234)
    steps = list(range(0, 46, 2))  # 23 calls, even steps only
    losses = [rng.uniform(1.0, 9.0) for _ in steps]
    lrs = [rng.uniform(1e-5, 1e-3) for _ in steps]
    (tmp_path / "spm.model").write_bytes(b"\x00sentencepiece\x01")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "a.txt").write_text("alpha")
    (tmp_path / "ckpt" / "sub").mkdir()
    (tmp_path / "ckpt" / "sub" / "b.txt").write_text("beta")

    with _tracker("train", tmp_path, store, flush_every=5, flush_seconds=3600) as t:
        assert t.active and t.run_id and t.parent_run_id and t.run_id != t.parent_run_id
        t.log_params({"model": {"d_model": 512, "n_heads": 8}, "train": {"betas": [0.9, 0.98]}, "long": "x" * 7000})
        with pytest.raises(ValueError, match="already logged"):
            t.log_params({"model": {"d_model": 256}})
        for i, step in enumerate(steps):
            t.log_metrics({"train/loss": losses[i], "lr": lrs[i]}, step=step)
            if i == 3:  # 4 calls buffered, nothing sent yet
                assert client.get_metric_history(t.run_id, "train/loss") == []
            if i == 4:  # 5th call triggers a batch
                assert len(client.get_metric_history(t.run_id, "train/loss")) == 5
        t.log_artifact(tmp_path / "spm.model", "tokenizer")
        t.log_artifacts(tmp_path / "ckpt", "checkpoints")
        t.set_tags({"seed": 7})
        run_id, parent_id = t.run_id, t.parent_run_id

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.data.tags["mlflow.runName"] == "train"
    assert run.data.tags["seed"] == "7"
    assert run.data.params["model.d_model"] == "512"
    assert run.data.params["model.n_heads"] == "8"
    assert run.data.params["train.betas"] == "[0.9, 0.98]"
    assert run.data.params["long"] == "x" * 6000
    assert client.get_run(parent_id).data.params["model.d_model"] == "512"  # train mirrors params on parent
    assert client.get_run(parent_id).info.status == "RUNNING"  # train is not the last stage

    for key, expected in (("train/loss", losses), ("lr", lrs)):
        hist = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in hist] == steps
        assert [m.value for m in hist] == pytest.approx(expected, rel=1e-12)

    dst = tmp_path / "download"
    client.download_artifacts(run_id, "", str(dst))
    assert (dst / "tokenizer" / "spm.model").read_bytes() == b"\x00sentencepiece\x01"
    assert (dst / "checkpoints" / "a.txt").read_text() == "alpha"
    assert (dst / "checkpoints" / "sub" / "b.txt").read_text() == "beta"
    # SQLite store: artifacts live beside the database, never in the CWD.
    stored = list((store[1] / "mlruns").rglob("spm.model"))
    assert len(stored) == 1 and run_id in stored[0].as_posix()
    assert not (tmp_path / "mlruns").exists()


def test_time_based_flush_and_bad_metrics(tmp_path: Path, store, client: MlflowClient) -> None:
    with _tracker("tokenize", tmp_path, store, flush_every=1000, flush_seconds=0.0) as t:
        t.log_metrics({"vocab_size": 8000}, step=0)
        assert [m.value for m in client.get_metric_history(t.run_id, "vocab_size")] == [8000.0]
        with pytest.raises(ValueError, match="not a number"):
            t.log_metrics({"loss": "abc"}, step=1)
        with pytest.raises(ValueError, match="bleu\\(test\\)"):
            t.log_metrics({"bleu(test)": 1.0}, step=1)
        with pytest.raises(ValueError, match="step"):
            t.log_metrics({"loss": 1.0}, step=-1)
        with pytest.raises(ValueError, match="step"):
            t.log_metrics({"loss": 1.0}, step=1.5)
        t.log_metrics({"loss": 0.5}, np.int64(3))  # the trainer's on_metrics(metrics, step) form
        assert [(m.step, m.value) for m in client.get_metric_history(t.run_id, "loss")] == [(3, 0.5)]
        with pytest.raises(FileNotFoundError):
            t.log_artifact(tmp_path / "missing.bin")
        assert t.active  # caller errors do not disable tracking


# ----------------------------------------------------------------- nesting and status


def test_train_then_evaluate_share_one_parent(tmp_path: Path, store, client: MlflowClient) -> None:
    with _tracker("train", tmp_path, store) as t:
        t.log_metrics({"train/loss": 2.0}, step=1)
        train_id, parent_id = t.run_id, t.parent_run_id
    assert (tmp_path / STATE_FILE).is_file()
    with _tracker("evaluate", tmp_path, store) as e:
        e.log_metrics({"bleu": 31.5}, step=0, parent=True)
        eval_id = e.run_id
        assert e.parent_run_id == parent_id
    assert STAGES.index("evaluate") < len(STAGES) - 1  # quantize follows evaluate
    assert client.get_run(parent_id).info.status == "RUNNING"  # evaluate is not the last stage
    with _tracker(STAGES[-1], tmp_path, store) as last:
        assert last.parent_run_id == parent_id
        last_id = last.run_id

    children = client.search_runs(
        [client.get_run(parent_id).info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    assert {r.info.run_id for r in children} == {train_id, eval_id, last_id}
    assert {r.data.tags["aiayn.stage"] for r in children} == {"train", "evaluate", STAGES[-1]}
    assert all(r.info.status == "FINISHED" for r in children)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"  # the last stage (quantize) ends the pipeline run
    assert parent.data.metrics["bleu"] == 31.5
    assert not (tmp_path / STATE_FILE).exists()

    with _tracker("train", tmp_path, store) as t2:  # a new pipeline run
        assert t2.parent_run_id != parent_id


def test_the_dag_s_last_stage_alone_ends_the_pipeline_run() -> None:
    """The stages say which one ends the pipeline run (their RECORD); the orchestrator's order agrees."""
    assert [s for s in STAGES if stage_record(s).ends_pipeline] == [STAGES[-1]]


def test_repeated_stage_starts_new_pipeline_run(tmp_path: Path, store, client: MlflowClient) -> None:
    with _tracker("prepare", tmp_path, store) as p:
        first_parent = p.parent_run_id
    with _tracker("train", tmp_path, store) as t:
        assert t.parent_run_id == first_parent  # prepare -> train: same pipeline run
    with _tracker("train", tmp_path, store) as t2:
        assert t2.parent_run_id != first_parent
    assert client.get_run(first_parent).info.status == "FINISHED"  # superseded, nothing failed


def test_failing_block_marks_child_failed(tmp_path: Path, store, client: MlflowClient) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with _tracker("train", tmp_path, store) as t:
            t.log_metrics({"train/loss": 3.0}, step=5)
            run_id, parent_id = t.run_id, t.parent_run_id
            raise RuntimeError("boom")
    assert client.get_run(run_id).info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [5]  # flushed on failure
    assert client.get_run(parent_id).info.status == "RUNNING"
    assert end_pipeline_run(tmp_path, status="FAILED", tracking_uri=store[0]) == parent_id
    assert client.get_run(parent_id).info.status == "FAILED"
    assert not (tmp_path / STATE_FILE).exists()


def test_env_parent_is_used_and_never_ended(tmp_path: Path, store, client: MlflowClient, monkeypatch) -> None:
    exp_id = client.create_experiment(f"orchestrated-{tmp_path.name}")
    parent_id = client.create_run(exp_id, run_name="flow").info.run_id
    monkeypatch.setenv("AIAYN_PARENT_RUN_ID", parent_id)
    with _tracker("evaluate", tmp_path, store) as e:
        run_id = e.run_id
        assert e.parent_run_id == parent_id
    run = client.get_run(run_id)
    assert run.info.experiment_id == exp_id
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert client.get_run(parent_id).info.status == "RUNNING"  # the orchestrator owns it
    assert not (tmp_path / STATE_FILE).exists()


# ----------------------------------------------------------------- registry, url


def test_register_model_with_alias(tmp_path: Path, store, client: MlflowClient) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.safetensors").write_bytes(b"weights")
    name = f"aiayn-{tmp_path.name}"
    with _tracker("export", tmp_path, store) as t:
        v1 = register_model(t, bundle, name, alias="champion")
        v2 = register_model(t, f"registered/{name}", name, alias="champion")  # already-logged artifact path
        run_id = t.run_id
    assert (v1, v2) == ("1", "2")
    mv = client.get_model_version_by_alias(name, "champion")
    assert str(mv.version) == "2" and mv.run_id == run_id  # int from SQLite, str over REST
    assert mv.source == f"runs:/{run_id}/registered/{name}"
    dst = tmp_path / "dl"
    client.download_artifacts(run_id, f"registered/{name}", str(dst))
    assert (dst / name / "model.safetensors").read_bytes() == b"weights"


def test_run_url(tmp_path: Path, store) -> None:
    with _tracker("prepare", tmp_path, store) as t:
        url = t.run_url()
        # the venv's own mlflow (a shell without the venv on PATH has none)
        command = str(Path(sys.executable).parent / "mlflow")
        assert url.startswith(f"{command} ui --backend-store-uri {store[0]}") and t.run_id in url, url
    assert t.run_url() is None  # after exit


def test_default_tracking_uri(tmp_path: Path, monkeypatch) -> None:
    assert resolve_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve().as_posix()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert resolve_tracking_uri(tmp_path) == "http://mlflow:5000"
    assert resolve_tracking_uri(tmp_path, "sqlite:///x.db") == "sqlite:///x.db"


# ----------------------------------------------------------------- failure, disabled


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_warns_once_and_goes_on(tmp_path: Path, caplog, monkeypatch) -> None:
    """A refused tracking server costs the stage one connection attempt (the probe), not one per call:
    counted at the socket, not timed."""
    caplog.set_level(logging.WARNING)
    (tmp_path / "f.txt").write_text("x")
    port = _closed_port()
    attempts: list[tuple] = []

    def counted(method):
        def wrapper(self, address):
            if isinstance(address, tuple) and address[1:2] == (port,):
                attempts.append(address)
            return method(self, address)
        return wrapper
    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, counted(getattr(socket.socket, name)))
    with Tracker(stage_record("train"), project_root=tmp_path, tracking_uri=f"http://127.0.0.1:{port}") as t:
        t.log_params({"a": 1})
        for step in range(20):
            t.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        t.log_artifact(tmp_path / "f.txt")
        t.set_tags({"k": "v"})
        assert register_model(t, tmp_path / "f.txt", "m") is None
        assert t.run_id is None and t.parent_run_id is None and t.run_url() is None
    assert len(attempts) == 1, attempts  # the probe, refused at once; nothing after it tried the server
    warnings = _aiayn_warnings(caplog)
    assert len(warnings) == 1
    assert "disabled" in warnings[0].getMessage() and "unreachable" in warnings[0].getMessage()
    assert not (tmp_path / STATE_FILE).exists()


def test_mlflow_error_midrun_disables_once(tmp_path: Path, store, client, caplog, monkeypatch) -> None:
    caplog.set_level(logging.WARNING)
    with _tracker("train", tmp_path, store, flush_every=1) as t:
        t.log_metrics({"loss": 1.0}, step=0)
        run_id = t.run_id

        def broken(*args, **kwargs):
            raise ConnectionError("store went away")

        monkeypatch.setattr(t._client, "log_batch", broken)
        for step in range(1, 5):
            t.log_metrics({"loss": 1.0}, step=step)  # must not raise
        t.log_params({"b": 2})
        assert not t.active
    warnings = _aiayn_warnings(caplog)
    assert len(warnings) == 1 and "store went away" in warnings[0].getMessage()
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0]


@pytest.mark.parametrize("how", ["argument", "env"])
def test_disabled_tracker_does_nothing(tmp_path: Path, monkeypatch, how: str) -> None:
    db = tmp_path / "never.db"
    kw = {"enabled": False} if how == "argument" else {}
    if how == "env":
        monkeypatch.setenv("AIAYN_TRACKING", "0")
    (tmp_path / "f.txt").write_text("x")
    with Tracker(stage_record("train"), project_root=tmp_path, tracking_uri=f"sqlite:///{db}", **kw) as t:
        t.log_params({"a": 1})
        t.log_metrics({"loss": 1.0}, step=0)
        t.log_artifact(tmp_path / "f.txt")
        assert register_model(t, tmp_path / "f.txt", "m") is None
        assert not t.active and t.run_id is None and t.run_url() is None
    assert not db.exists()
    assert not (tmp_path / STATE_FILE).exists() and not (tmp_path / "mlruns").exists()


# ----------------------------------------------------------------- helpers


DVC_LOCK = """\
schema: '2.0'
stages:
  prepare:
    cmd: python -m aiayn prepare
    deps:
    - path: data/multi30k
      hash: md5
      md5: 1111aaaa.dir
      size: 100
      nfiles: 6
    - path: src/aiayn/stages/prepare.py
      hash: md5
      md5: 2222bbbb
    params:
      params.yaml:
        data.min_len: 1
    outs:
    - path: artifacts/prepared
      hash: md5
      md5: 3333cccc.dir
  tokenize:
    cmd: python -m aiayn tokenize
    deps:
    - path: artifacts/prepared
      hash: md5
      md5: 3333cccc.dir
    - path: https://example.com/remote.txt
      etag: abc
    outs:
    - path: ./artifacts/tokenized
      hash: md5
      md5: 4444dddd.dir
"""

DATA_DVC = """\
outs:
- md5: 5555eeee.dir
  size: 123
  nfiles: 7
  hash: md5
  path: data/multi30k
"""


def test_dvc_data_hashes(tmp_path: Path) -> None:
    assert dvc_data_hashes(tmp_path) == {}
    (tmp_path / ".dvc").mkdir()  # a real DVC project has this directory; it is no .dvc file
    (tmp_path / ".dvc" / "config").write_text("[core]\n")
    (tmp_path / "dvc.lock").write_text(DVC_LOCK)
    (tmp_path / "data.dvc").write_text(DATA_DVC)
    assert dvc_data_hashes(tmp_path) == {
        "data/multi30k": "5555eeee.dir",  # data.dvc (an out) wins over the lock's dep entry
        "src/aiayn/stages/prepare.py": "2222bbbb",
        "artifacts/prepared": "3333cccc.dir",
        "artifacts/tokenized": "4444dddd.dir",
    }
    (tmp_path / "dvc.lock").write_text("stages: [unclosed\n")
    with pytest.raises(ValueError, match="dvc.lock"):
        dvc_data_hashes(tmp_path)


def test_data_hashes_become_tags(tmp_path: Path, store, client: MlflowClient) -> None:
    (tmp_path / "dvc.lock").write_text(DVC_LOCK)
    with _tracker("train", tmp_path, store) as t:
        run_id, parent_id = t.run_id, t.parent_run_id
    for rid in (run_id, parent_id):
        tags = client.get_run(rid).data.tags
        assert tags["data_hash.artifacts/prepared"] == "3333cccc.dir"
        assert tags["data_hash.data/multi30k"] == "1111aaaa.dir"
        assert tags["git.dirty"] == "false" and "git.commit" not in tags  # tmp_path is no git repo


def test_import_is_lazy() -> None:
    code = "import sys, aiayn.tracking; print('mlflow' in sys.modules, 'dvc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
    assert tracking.__name__ == "aiayn.tracking"


# ----------------------------------------------------------------- what the MLflow UI shows


def test_experiment_kind_is_model_training(tmp_path: Path, store, client: MlflowClient) -> None:
    with _tracker("train", tmp_path, store, experiment="kind-new"):
        pass
    assert client.get_experiment_by_name("kind-new").tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    old = client.create_experiment("kind-old")  # made before this rule: the tag is added on next use
    assert tracking.EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    with _tracker("train", tmp_path, store, experiment="kind-old"):
        pass
    assert client.get_experiment(old).tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_headline_metrics_reach_the_pipeline_run(tmp_path: Path, store, client: MlflowClient) -> None:
    with _tracker("train", tmp_path, store) as t:
        t.log_metrics({"train/loss": 3.0, "lr": 1e-4}, step=10)
        t.log_metrics({"valid_loss": 2.5, "valid_ppl": 9.0}, step=10)
        t.log_metrics({"averaged_valid_loss": 2.4}, step=20)
        parent_id = t.parent_run_id
    with _tracker("evaluate", tmp_path, store) as e:
        e.log_metrics({"test_2016_flickr.bleu": 36.8, "test_2016_flickr.chrf": 62.1,
                       "test_2016_flickr.decode_seconds": 7.0}, step=20)
    with _tracker("quantize", tmp_path, store) as q:  # a variant's BLEU is not the pipeline's headline
        q.log_metrics({"ct2-int8.test_2016_flickr.bleu": 36.7}, step=0)
    parent = client.get_run(parent_id).data.metrics
    assert parent == {"valid_loss": 2.5, "valid_ppl": 9.0, "averaged_valid_loss": 2.4,
                      "test_2016_flickr.bleu": 36.8, "test_2016_flickr.chrf": 62.1}
    history = client.get_metric_history(parent_id, "valid_loss")
    assert [(m.step, m.value) for m in history] == [(10, 2.5)]


def _prepared_project(root: Path) -> None:
    (root / "data.dvc").write_text(DATA_DVC)
    (root / "params.yaml").write_text("data:\n  src_lang: en\n  tgt_lang: de\n  train_split: train\n"
                                      "  valid_split: val\n  test_splits: [test_a, test_b]\n")
    prepared = root / "artifacts" / "prepared"
    prepared.mkdir(parents=True)
    for split, n in (("train", 5), ("val", 2), ("test_a", 3), ("test_b", 1)):
        for lang in ("en", "de"):
            (prepared / f"{split}.{lang}").write_text("".join(f"{split} {lang} {i}\n" for i in range(n)))


def _stage_reads(stage: str, root: Path) -> StageRecord:
    """The record the stage's ``run`` opens its run with in project ``root`` (its ``params.yaml``):
    ``RECORD`` plus the prepared splits it reads."""
    d, layout = load_params(root / "params.yaml").data, Layout(root)
    langs = (d.src_lang, d.tgt_lang)
    reads = {"train": (*split_reads(layout, [d.train_split], langs, "training"),
                       *split_reads(layout, [d.valid_split], langs, "validation")),
             "evaluate": split_reads(layout, d.test_splits, langs, "test")}
    return stage_record(stage).reading(*reads.get(stage, ()))


def _datasets(root: Path, stage: str) -> list[dict[str, str]]:
    record = _stage_reads(stage, root)
    return tracking.dvc_datasets(root, record.datasets, source_data=record.source_data)


def test_datasets_are_dvc_digests(tmp_path: Path) -> None:
    from dvc_data.hashfile.hash import file_md5
    from dvc_objects.fs.local import LocalFileSystem

    _prepared_project(tmp_path)
    train = _datasets(tmp_path, "train")
    assert [(d["name"], d["context"]) for d in train] == [
        ("data/multi30k", "source"), ("train.en", "training"), ("train.de", "training"),
        ("val.en", "validation"), ("val.de", "validation")]
    assert train[0]["digest"] == "5555eeee"  # data.dvc's md5 without DVC's ".dir" suffix
    fs = LocalFileSystem()
    for d in train[1:]:
        path = tmp_path / d["source"]
        assert d["digest"] == file_md5(str(path), fs)  # DVC's own content hash of the file
    assert json.loads(train[1]["profile"]) == {"lines": 5, "bytes": (tmp_path / "artifacts/prepared/train.en").stat().st_size}
    assert [d["name"] for d in _datasets(tmp_path, "evaluate")] == [
        "test_a.en", "test_a.de", "test_b.en", "test_b.de"]
    assert _datasets(tmp_path, "quantize") == []


def test_datasets_become_run_inputs(tmp_path: Path, store, client: MlflowClient) -> None:
    _prepared_project(tmp_path)
    with _tracker(_stage_reads("train", tmp_path), tmp_path, store) as t:
        run_id, parent_id = t.run_id, t.parent_run_id
    with _tracker(_stage_reads("evaluate", tmp_path), tmp_path, store):
        pass

    def inputs(rid: str) -> dict[str, tuple[str, str]]:
        got = client.get_run(rid).inputs.dataset_inputs
        return {i.dataset.name: (i.dataset.digest, {t.key: t.value for t in i.tags}["mlflow.data.context"]) for i in got}

    child = inputs(run_id)
    assert set(child) == {"data/multi30k", "train.en", "train.de", "val.en", "val.de"}
    assert child["val.de"][1] == "validation"
    parent = inputs(parent_id)  # the pipeline run: everything its stages read
    assert set(parent) == set(child) | {"test_a.en", "test_a.de", "test_b.en", "test_b.de"}
    assert parent["test_b.en"][1] == "test"


# ----------------------------------------------------------------- concurrent stages, DVC experiments

CONCURRENT_STAGE = r"""
import sys
from aiayn.tracking import Tracker
root, uri, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Tracker(f"train", project_root=root, tracking_uri=uri, end_pipeline=True) as t:
    if not t.active:
        raise SystemExit("tracking disabled")
    for step in range(50):
        t.log_metrics({"loss": 10.0 - step / 10 + i}, step=step)
    print(t.run_id)
"""


def test_four_stage_processes_on_a_fresh_store_all_land(tmp_path: Path) -> None:
    """Queued DVC experiments start their stages at once: on a fresh SQLite store, MLflow's schema
    creation raced and runs were lost ("MLflow tracking disabled"). Every process must land."""
    uri = f"sqlite:///{(tmp_path / 'fresh.db').as_posix()}"
    procs = []
    for i in range(4):
        root = tmp_path / f"exp{i}"
        root.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", CONCURRENT_STAGE, str(root), uri, str(i)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    client = MlflowClient(tracking_uri=uri)
    for out, _ in outs:
        history = client.get_metric_history(out.strip().splitlines()[-1], "loss")
        assert [m.step for m in history] == list(range(50))


def test_dvc_experiment_copies_track_into_the_projects_store(tmp_path: Path, monkeypatch) -> None:
    """`dvc exp run --temp` / queued runs execute in a copy under .dvc/tmp/exps; DVC gives their
    stages DVC_ROOT = the project. The default store is the project's, not the copy's."""
    project = tmp_path / "project"
    copy = project / ".dvc" / "tmp" / "exps" / "tmpabc123"
    copy.mkdir(parents=True)
    assert resolve_tracking_uri(copy) == f"sqlite:///{(copy / 'mlflow.db').as_posix()}"
    monkeypatch.setenv("DVC_ROOT", str(project))
    assert resolve_tracking_uri(copy) == f"sqlite:///{(project / 'mlflow.db').as_posix()}"
    assert resolve_tracking_uri(project) == f"sqlite:///{(project / 'mlflow.db').as_posix()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")  # an explicit store still wins
    assert resolve_tracking_uri(copy) == "http://tracking:5000"


# ----------------------------------------------------------------- a pipeline run readable at a glance


def test_pipeline_writes_do_not_make_a_fresh_clone_dirty(tmp_path: Path) -> None:
    """A clone-like repository: what `make run` writes (dvc.lock rewritten, artifacts/, .aiayn/, mlflow.db,
    even when git tracks them) is not the user's code; an edit to the code or params is."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for rel, text in (("dvc.lock", "schema: '2.0'\n"), ("params.yaml", "train: {}\n"), ("src/aiayn/x.py", "x = 1\n"),
                      ("artifacts/model/model.json", "{}\n")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")  # dvc repro rewrote the lock
    (tmp_path / "artifacts" / "model" / "model.json").write_text('{"step": 1}\n')
    (tmp_path / ".aiayn").mkdir()
    (tmp_path / ".aiayn" / "pipeline_run.json").write_text("{}")
    (tmp_path / "mlflow.db").write_text("db")
    commit, dirty = git_commit(tmp_path)
    assert commit and not dirty
    assert tracking.git_tags(tmp_path)["git.dirty"] == "false"
    (tmp_path / "params.yaml").write_text("train: {max_steps: 3}\n")
    assert git_commit(tmp_path)[1] is True
    subprocess.run([*git, "checkout", "-q", "params.yaml"], check=True)
    (tmp_path / "src" / "aiayn" / "x.py").write_text("x = 2\n")
    assert git_commit(tmp_path)[1] is True


def test_data_version_is_the_corpus_the_run_read(tmp_path: Path) -> None:
    """``data.version`` names the corpus the ``corpus`` stage read (its data dependency in ``dvc.lock``), not
    ``data.dvc``'s Multi30k when the run reads a corpus of one's own (``corpora/mine``, README); before the
    corpus stage has run, ``data.dvc``'s. The old rule (the first path under ``data/``) gave Multi30k's."""
    from aiayn.tracking.lineage import corpus_version, lineage_tags

    (tmp_path / "data.dvc").write_text(DATA_DVC)
    assert lineage_tags(tmp_path)["data.version"] == "5555eeee.dir"  # no dvc.lock yet: data.dvc's
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  corpus:\n    cmd: python -m pipelines.run_stage corpus\n    deps:\n"
        "    - path: corpora/mine\n      hash: md5\n      md5: 7777aaaa.dir\n"
        "    - path: src/aiayn/stages/corpus.py\n      hash: md5\n      md5: 8888bbbb\n"
        "    outs:\n    - path: artifacts/corpus\n      hash: md5\n      md5: 9999cccc.dir\n")
    assert lineage_tags(tmp_path)["data.version"] == "7777aaaa.dir"
    (tmp_path / "dvc.lock").write_text("stages: [unclosed\n")
    assert corpus_version(tmp_path, {"data/multi30k": "5555eeee.dir"}) == "5555eeee.dir"


def test_only_data_hashes_are_tags_all_hashes_are_one_artifact(tmp_path: Path, store, client: MlflowClient) -> None:
    (tmp_path / "dvc.lock").write_text(DVC_LOCK)
    (tmp_path / "data.dvc").write_text(DATA_DVC)
    with _tracker("train", tmp_path, store) as t:
        parent_id = t.parent_run_id
    tags = client.get_run(parent_id).data.tags
    hashed = {k for k in tags if k.startswith("data_hash.")}
    assert hashed == {"data_hash.data/multi30k", "data_hash.artifacts/prepared", "data_hash.artifacts/tokenized"}
    assert tags["data.version"] == "5555eeee.dir"  # the corpus version data.dvc names
    local = client.download_artifacts(parent_id, "lineage/dvc_hashes.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text())["src/aiayn/stages/prepare.py"] == "2222bbbb"  # code: in the artifact


def test_the_pipeline_run_description_opens_with_the_budget(tmp_path: Path, store, client: MlflowClient) -> None:
    """A run cut by the clock says so in the pipeline run's first description line and in a tag; the
    description carries the headline scores, the model choice and the data version."""
    (tmp_path / "data.dvc").write_text(DATA_DVC)
    with _tracker("train", tmp_path, store) as t:
        t.log_metrics({"averaged_valid_loss": 3.26, "averaged_valid_bleu": 30.1}, step=1590)
        t.log_metrics({"valid_loss": 3.31, "valid_bleu": 29.4}, step=1500)
        t.set_tags({"train.budget": "CUT by max_time_s at step 1590 of max_steps 2600: training did not finish",
                    "train.budget_cut": "max_time_s", "train.stopped_by": "max_time_s", "train.stop_step": 1590,
                    "train.selection": "step 1590 (valid_loss 3.2610)", "seed": "1"})
        parent_id = t.parent_run_id
    with _tracker("evaluate", tmp_path, store) as e:
        e.log_metrics({"test_2016_flickr.bleu": 31.5, "test_2016_flickr.chrf": 55.0}, step=0)
    run = client.get_run(parent_id).data
    assert run.tags["train.budget_cut"] == "max_time_s" and "seed" not in run.tags  # headline tags only
    text = run.tags["mlflow.note.content"]
    first = text.splitlines()[0]
    assert first.startswith("**WARNING: training CUT by max_time_s at step 1590")
    assert "| test_2016_flickr | 31.50 | 55.00 |" in text
    # each validation line says whose scores they are ("averaged_valid_*" may name a single checkpoint, and
    # "valid_*" the last in-training validation, 400 steps before the end, side by side)
    assert "Validation of the chosen model: loss 3.26 (`averaged_valid_loss`), BLEU 30.1 (`averaged_valid_bleu`)" in text
    assert "Last validation during training: loss 3.31 (`valid_loss`), BLEU 29.4 (`valid_bleu`)" in text
    assert "Model: step 1590" in text and "`5555eeee.dir`" in text
    assert tracking.parent.describe_pipeline({}, {"train.budget": "complete: max_steps 2600 reached",
                                                  "train.stopped_by": "max_steps", "train.stop_step": "2600"}
                                             ).startswith("Training complete: max_steps 2600 reached")
    described = tracking.parent.describe_pipeline({}, {"data.corpus.kind": "hf", "data.corpus.pair": "en-fr",
                                                       "data.corpus.revision": "abc123", "data.version": "d.dir"})
    assert "Corpus: kind hf, pair en-fr, revision abc123. Data version: `d.dir`" in described
