"""The recorder a stage is handed (``aiayn.recording``) and the settings it reads (``aiayn.config.settings``).

``NullRecorder`` records nothing but checks every call like the MLflow recorder does (checked here
against a ``Tracker`` with tracking off, which needs no store), so a stage tested with it logs the
same calls into MLflow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.recording import NULL_RECORDER, DatasetRead, NullRecorder, StageRecord
from aiayn.config.settings import PARENT_RUN_ENV, Settings
from aiayn.stages import Layout, split_reads
from aiayn.tracking import MlflowRecorder, Tracker

BAD_CALLS = [
    ("log_params", ({"bad key!": 1},), ValueError, "invalid MLflow param key"),
    ("log_params", ([1, 2],), ValueError, "expects a mapping"),
    ("log_metrics", ({"loss": "abc"}, 1), ValueError, "not a number"),
    ("log_metrics", ({"bleu(test)": 1.0}, 1), ValueError, r"bleu\(test\)"),
    ("log_metrics", ({"loss": 1.0}, -1), ValueError, "step"),
    ("log_metrics", ({"loss": 1.0}, 1.5), ValueError, "step"),
    ("log_metrics", ({"loss": 1.0}, True), ValueError, "step"),
    ("set_tags", ({"a//b": "x"},), ValueError, "normalised path"),
    ("log_artifact", ("missing.bin",), FileNotFoundError, "no such file"),
    ("log_artifacts", ("missing-dir",), FileNotFoundError, "no such directory"),
]


@pytest.mark.parametrize("method,args,error,match", BAD_CALLS)
def test_null_run_refuses_what_the_mlflow_run_refuses(tmp_path, monkeypatch, method, args, error, match):
    monkeypatch.chdir(tmp_path)
    with NULL_RECORDER.start(StageRecord("train")) as run:
        with pytest.raises(error, match=match):
            getattr(run, method)(*args)
    with Tracker("train", project_root=tmp_path, enabled=False) as t:
        with pytest.raises(error, match=match):
            getattr(t, method)(*args)


def test_null_run_accepts_a_stage_s_calls_and_registers_nothing(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with NullRecorder().start(StageRecord("export")) as run:
        run.log_params({"model": {"d_model": 512}, "train": {"betas": [0.9, 0.98]}})
        run.log_metrics({"loss": 1.0}, 3)
        run.set_tags({"export.variant": "ct2-int8"})
        run.log_artifact(tmp_path / "f.txt", artifact_path="x")
        run.log_artifacts(tmp_path, artifact_path="x")
        run.flush()
        assert run.register_translation_model(tmp_path, name="m", variant="v", gate_split="s", bleu=1.0,
                                              example=["a"], predictor=object) is None


def test_stage_record_checks_its_policy():
    with pytest.raises(ValueError, match="invalid stage name"):
        StageRecord("bad stage!")
    with pytest.raises(ValueError, match="not a regular expression"):
        StageRecord("train", headline_metrics="(")
    record = StageRecord("train", source_data=True)
    more = record.reading(DatasetRead("a/b.en", "training")).reading(DatasetRead("a/b.de", "training"))
    assert record.datasets == () and [d.path for d in more.datasets] == ["a/b.en", "a/b.de"]
    assert more.source_data and more.stage == "train"


def test_split_reads_are_prepared_files_relative_to_the_root(tmp_path):
    reads = split_reads(Layout(tmp_path), ["train", "val"], ("en", "de"), "training")
    assert reads == tuple(DatasetRead(f"artifacts/prepared/{s}.{lang}", "training")
                          for s in ("train", "val") for lang in ("en", "de"))
    assert split_reads(Layout(Path(".")), ["t"], ["en"], "test") == (DatasetRead("artifacts/prepared/t.en", "test"),)


def test_mlflow_recorder_opens_a_tracker_with_the_stage_s_record(tmp_path):
    record = StageRecord("monitor_reference", ends_pipeline=True)
    settings = Settings(tracking=False)
    t = MlflowRecorder(tmp_path, tracking_uri="sqlite:///x.db", settings=settings).start(record)
    assert isinstance(t, Tracker) and t.record is record and t._end_pipeline and not t._enabled
    assert t.project_root == tmp_path.resolve() and t.tracking_uri == "sqlite:///x.db"


# --------------------------------------------------------------------------- settings


def test_settings_defaults_and_parsing():
    assert Settings.from_env({}) == Settings()
    assert Settings().tracking and Settings().serve_threads == 1 and Settings().flash_autotune
    env = {"AIAYN_TRACKING": " Off ", PARENT_RUN_ENV: "abc", "AIAYN_DATA_MIRROR": "/m", "AIAYN_SERVE_THREADS": "4",
           "AIAYN_FLASH_AUTOTUNE": "0", "AIAYN_STAGE_ERROR_FILE": "/tmp/e", "AIAYN_PIPELINE_RUN_ID": "p",
           "AIAYN_DVC_REMOTE": "s3", "AIAYN_REGISTERED_MODEL": "m", "AIAYN_REQUEST_LOG_URL": "postgresql://h/db"}
    s = Settings.from_env(env)
    assert (s.tracking, s.parent_run_id, s.data_mirror, s.serve_threads, s.flash_autotune) == (
        False, "abc", Path("/m"), 4, False)
    assert (s.stage_error_file, s.pipeline_run_id, s.dvc_remote, s.registered_model_override, s.request_log_url) == (
        Path("/tmp/e"), "p", "s3", "m", "postgresql://h/db")


def test_every_setting_is_read_by_the_product():
    """``Settings`` is the product's environment: each field has a reader in src/, pipelines/ or
    monitoring/ (outside settings.py). A switch only the tests read (``AIAYN_TEST_STRICT``,
    ``AIAYN_TEST_DISTRIBUTED``) is the tests' own and lives in tests/support."""
    import dataclasses
    import re

    repo = Path(__file__).resolve().parents[1]
    product = [p for top in ("src", "pipelines", "monitoring") for p in (repo / top).rglob("*.py")
               if p.name != "settings.py"]
    text = "\n".join(p.read_text(encoding="utf-8") for p in product)
    unread = [f.name for f in dataclasses.fields(Settings) if not re.search(rf"\.{f.name}\b", text)]
    assert not unread, f"Settings fields no product code reads: {unread}"
    from aiayn.config import settings

    assert not [v for k, v in vars(settings).items() if k.endswith("_ENV") and v.startswith("AIAYN_TEST_")]
    assert not hasattr(settings, "REQUIRE_SERVICES_ENV")
    for off in ("0", "false", "NO", "off"):
        assert not Settings.from_env({"AIAYN_TRACKING": off}).tracking
    assert Settings.from_env({"AIAYN_TRACKING": "yes"}).tracking


def test_registered_model_override_is_the_variable_as_given():
    """Unset: None, so the export stage names the model after the pair (aiayn.config.schema.registered_model_name);
    set (even empty, which registered_model_name refuses): the value."""
    from aiayn.config.schema import ConfigError, DataConfig, registered_model_name

    assert Settings.from_env({}).registered_model_override is None
    assert Settings.from_env({"AIAYN_REGISTERED_MODEL": "m"}).registered_model_override == "m"
    assert Settings.from_env({"AIAYN_REGISTERED_MODEL": ""}).registered_model_override == ""
    fr = DataConfig(tgt_lang="fr")
    assert registered_model_name(fr, Settings.from_env({}).registered_model_override) == "aiayn-en-fr"
    assert registered_model_name(fr, Settings.from_env({"AIAYN_REGISTERED_MODEL": "m"}).registered_model_override) == "m"
    with pytest.raises(ConfigError, match="empty"):
        registered_model_name(fr, Settings.from_env({"AIAYN_REGISTERED_MODEL": ""}).registered_model_override)


def test_settings_empty_is_unset_and_bad_numbers_are_named():
    s = Settings.from_env({PARENT_RUN_ENV: "", "AIAYN_DATA_MIRROR": "", "AIAYN_DVC_REMOTE": "", "AIAYN_STAGE_ERROR_FILE": ""})
    assert (s.parent_run_id, s.data_mirror, s.dvc_remote, s.stage_error_file) == (None, None, None, None)
    with pytest.raises(ValueError, match="AIAYN_SERVE_THREADS must be an integer, got 'two'"):
        Settings.from_env({"AIAYN_SERVE_THREADS": "two"})
    with pytest.raises(AttributeError):
        Settings().tracking = False  # frozen


def test_settings_read_the_environment_when_asked(monkeypatch):
    monkeypatch.setenv("AIAYN_TRACKING", "0")
    assert not Settings.from_env().tracking
    monkeypatch.setenv("AIAYN_TRACKING", "1")
    assert Settings.from_env().tracking
