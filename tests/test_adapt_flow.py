"""The adapt flow's trigger (N drift checks in a row, K new reviewed pairs, both counted since the last adaptation)
and the flow itself on a scratch project with the heavy steps replaced: the adapted params.yaml the pipeline
sees and its restoration, the state it keeps, a run that finds another one going, a failed pipeline."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from aiayn.adaptation.adapt_plan import AdaptError, adapted_overrides, prepare_corpus
from aiayn.adaptation.trigger import (STATE_FILE, TriggerError, adapt_lock, check_trigger, drift_summaries,
                                      drift_streak, read_state, write_state)
from aiayn.config.adaptation import AdaptTriggerConfig
from aiayn.config.schema import load_params

REPO = Path(__file__).resolve().parents[1]
NAME = "aiayn-en-de"
#: Released by a test; a flow run's fake pipeline that has set RUNNING waits on it.
RELEASE, RUNNING = threading.Event(), threading.Event()


def _check(drift_dir: Path, minute: int, verdict: str) -> None:
    folder = drift_dir / f"20260101T00{minute:02d}00000000Z"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"verdict": verdict,
                                                     "checked_at": f"2026-01-01T00:{minute:02d}:00+00:00"}))


# --------------------------------------------------------------------------- the trigger


def test_n_drifted_windows_in_a_row_fire_and_an_interruption_resets(tmp_path):
    drift = tmp_path / "drift"
    for minute, verdict in enumerate(["drift", "drift", "no_drift", "drift", "drift"]):
        _check(drift, minute, verdict)
    (drift / ".20260101T009900.tmp").mkdir()  # a check being written: never read
    (drift / ".20260101T009900.tmp" / "summary.json").write_text("{half")
    summaries = drift_summaries(drift)
    assert [s["verdict"] for s in summaries] == ["drift", "drift", "no_drift", "drift", "drift"]
    assert drift_streak(summaries, 2).fire and not drift_streak(summaries, 3).fire
    assert drift_streak(summaries, 3).reason == "2 of the last 3 drift checks found drift"
    _check(drift, 5, "drift")
    assert drift_streak(drift_summaries(drift), 3).fire
    # only the checks after the last adaptation count
    since = drift_summaries(drift, since="2026-01-01T00:03:30+00:00")
    assert len(since) == 2 and drift_streak(since, 3).reason == "2 drift check(s) since the last adaptation, 3 needed"
    (drift / "broken").mkdir()
    (drift / "broken" / "summary.json").write_text("{not json")
    with pytest.raises(TriggerError, match="broken/summary.json: not valid JSON"):
        drift_summaries(drift)


def test_k_new_reviewed_pairs_fire_counted_from_the_last_adaptation(tmp_path):
    corpus, drift = tmp_path / "reviewed" / "train.tsv", tmp_path / "drift"
    cfg = AdaptTriggerConfig(drift_windows=3, reviewed_pairs=5)
    none = check_trigger(cfg, drift_dir=drift, corpus=corpus, state={})
    assert not none.fire and "grew by 0 pairs, 5 needed" in none.reason and "0 drift check(s)" in none.reason
    corpus.parent.mkdir()
    corpus.write_text("".join(f"s{i}\tt{i}\n" for i in range(7)) + "\n")  # a blank line is no pair
    assert check_trigger(cfg, drift_dir=drift, corpus=corpus, state={}).fire
    after = check_trigger(cfg, drift_dir=drift, corpus=corpus, state={"reviewed_pairs": 3})
    assert not after.fire and "grew by 4 pairs, 5 needed" in after.reason
    with corpus.open("a") as f:
        f.write("s7\tt7\n")
    fired = check_trigger(cfg, drift_dir=drift, corpus=corpus, state={"reviewed_pairs": 3})
    assert fired.fire and fired.reason == f"the reviewed corpus {corpus} grew by 5 pairs (>= 5)"


def test_the_state_is_written_whole_and_a_bad_one_is_named(tmp_path):
    assert read_state(tmp_path) == {}
    write_state(tmp_path, {"adapted_at": "2026-01-01T00:00:00+00:00", "reviewed_pairs": 3})
    assert read_state(tmp_path)["reviewed_pairs"] == 3
    assert [p.name for p in (tmp_path / STATE_FILE).parent.iterdir()] == [STATE_FILE.name]  # no temporary left
    (tmp_path / STATE_FILE).write_text("[1]")
    with pytest.raises(TriggerError, match="expected a JSON object"):
        read_state(tmp_path)


def test_the_lock_is_held_once(tmp_path):
    with adapt_lock(tmp_path) as first:
        with adapt_lock(tmp_path) as second:
            assert first is True and second is False
    with adapt_lock(tmp_path) as again:
        assert again is True


# --------------------------------------------------------------------------- the adapted run's data and params


def _project(root: Path, *, pairs: int = 6) -> Path:
    """A project folder: params.yaml (the shipped one, a new-domain split named, K = 5), the reviewed corpus and
    the new domain's test split, prepared val/test text to fill the folder from, a champion in its registry."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["adapt"]["gate"]["new_domain_split"] = "test_news"
    params["adapt"]["trigger"]["reviewed_pairs"] = 5
    root.mkdir(parents=True)
    (root / "params.yaml").write_text("# the project's own comment\n" + yaml.safe_dump(params, sort_keys=False))
    reviewed = root / "data" / "reviewed"
    reviewed.mkdir(parents=True)
    (reviewed / "train.tsv").write_text("".join(f"a man {i}\tein Mann {i}\n" for i in range(pairs)))
    (reviewed / "test_news.tsv").write_text("the news\tdie Nachrichten\n")
    prepared = root / "artifacts" / "prepared"
    prepared.mkdir(parents=True)
    for split in ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        (prepared / f"{split}.en").write_text(f"a {split} dog\n")
        (prepared / f"{split}.de").write_text(f"ein {split} Hund\n")
    uri = f"sqlite:///{(root / 'mlflow.db').as_posix()}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.create_run(client.create_experiment("e", artifact_location=(root / "mlruns").as_uri()))
    client.create_registered_model(NAME)
    client.create_model_version(NAME, source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    client.set_registered_model_alias(NAME, "champion", "1")
    return root


def test_the_adapted_run_reads_the_reviewed_corpus_from_the_champion(tmp_path):
    root = _project(tmp_path / "p")
    params = load_params(root / "params.yaml")
    over = adapted_overrides(params, init_from=f"models:/{NAME}@champion")
    assert over == {"train.init_from": f"models:/{NAME}@champion",
                    "data.corpus": {"kind": "tsv", "path": "data/reviewed", "splits": {"train": "data/reviewed/train.tsv"}},
                    "data.test_splits": ["test_news", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]}
    written = prepare_corpus(params, root, root / "artifacts" / "prepared")
    assert written == ["val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
    assert (root / "data" / "reviewed" / "test_2017_mscoco.tsv").read_text() == "a test_2017_mscoco dog\tein test_2017_mscoco Hund\n"
    assert prepare_corpus(params, root, root / "artifacts" / "prepared") == []  # once: what is there is kept
    (root / "data" / "reviewed" / "test_news.tsv").unlink()
    with pytest.raises(AdaptError, match=r"test_news.tsv not found: put the new domain's test pairs there"):
        prepare_corpus(params, root, root / "artifacts" / "prepared")
    # reviewed answers to a test split's own sentences: prepare would drop every pair as test-contaminated
    (root / "data" / "reviewed" / "test_news.tsv").write_text("the news\tdie Nachrichten\n")
    (root / "data" / "reviewed" / "train.tsv").write_text("a test_2017_mscoco dog\tein Hund im Bild\n")
    with pytest.raises(AdaptError, match=r"every one of the 1 reviewed sources .* \(test_2017_mscoco holds 1\): "
                                         r"prepare would drop them all as test-contaminated; take that split out"):
        prepare_corpus(params, root, root / "artifacts" / "prepared")
    unset = params.model_copy(update={"adapt": params.adapt.model_copy(update={
        "gate": params.adapt.gate.model_copy(update={"new_domain_split": None})})})
    with pytest.raises(AdaptError, match="adapt.gate.new_domain_split is not set"):
        adapted_overrides(unset, init_from="x")


# --------------------------------------------------------------------------- the flow


@pytest.fixture
def flow_env(monkeypatch, tmp_path):
    """The scratch project, the adapt flow module with its pipeline and gate replaced by fakes that record what
    they saw (the params file the pipeline ran on), and a clean tracking environment."""
    import aiayn.adaptation.gate_run as gate_run
    import pipelines.adapt_flow as adapt_flow

    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    root = _project(tmp_path / "project")
    seen: dict = {"pipeline": [], "gate": []}
    RELEASE.set()
    RUNNING.clear()

    def fake_pipeline(root_path, push):
        seen["pipeline"].append((root_path / "params.yaml").read_text())
        RUNNING.set()
        assert RELEASE.wait(60), "the test never released the pipeline"
        if seen.get("fail"):
            raise AdaptError("the adapted pipeline did not complete: stage train failed")
        return {"mlflow_run": "pipeline-run"}

    def fake_gate(params, layout, *, name, tracking_uri, parent_run_id):
        seen["gate"].append({"init_from": params.train.init_from, "tests": params.data.test_splits,
                             "parent_run_id": parent_run_id})
        return {"promote": False, "summary": "champion kept: test_news: gained +0.20 BLEU (20.00 -> 20.20), needs >= 1.00",
                "reasons": ["test_news: gained +0.20 BLEU (20.00 -> 20.20), needs >= 1.00"], "gain_min": 1.0,
                "loss_max": 0.5, "signatures": {}, "new_domain": {"split": "test_news", "challenger": 20.2, "parent": 20.0,
                                                                  "gain": 0.2},
                "old": [{"split": "test_2016_flickr", "challenger": 30.0, "parent": 30.0, "loss": 0.0}],
                "registry": {"promoted": False, "version": "2", "champion": "1"}}

    monkeypatch.setattr(adapt_flow, "run_adapted_pipeline", fake_pipeline)
    monkeypatch.setattr(gate_run, "promotion_gate", fake_gate)
    return {"root": root, "seen": seen, "flow": adapt_flow.adapt}


def test_the_flow_adapts_on_the_trigger_then_gates_and_restores_params(flow_env, prefect_harness):
    root, seen, adapt = flow_env["root"], flow_env["seen"], flow_env["flow"]
    before = (root / "params.yaml").read_text()
    state = adapt(root=str(root), push=False, return_state=True)
    assert state.is_completed(), state.message
    assert state.message == "champion kept: test_news: gained +0.20 BLEU (20.00 -> 20.20), needs >= 1.00"
    (ran_on,) = seen["pipeline"]
    adapted = yaml.safe_load(ran_on)
    assert adapted["train"]["init_from"] == f"models:/{NAME}@champion"
    assert adapted["data"]["corpus"] == {"kind": "tsv", "path": "data/reviewed", "splits": {"train": "data/reviewed/train.tsv"}}
    assert ran_on.startswith("# the project's own comment")  # the edit keeps the file's comments
    assert seen["gate"] == [{"init_from": f"models:/{NAME}@champion", "parent_run_id": "pipeline-run",
                             "tests": ("test_news", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")}]
    assert (root / "params.yaml").read_text() == before  # put back as it was
    saved = read_state(root)
    assert saved["reviewed_pairs"] == 6 and saved["promoted"] is False and saved["challenger"] == "2"
    assert "grew by 6 pairs" in saved["trigger"]
    again = adapt(root=str(root), push=False, return_state=True)  # nothing new since: no adaptation
    assert again.is_completed() and again.message.startswith("no adaptation: ") and len(seen["pipeline"]) == 1
    forced = adapt(root=str(root), push=False, force=True, return_state=True)
    assert forced.is_completed() and len(seen["pipeline"]) == 2


def test_a_second_run_while_one_runs_is_skipped_with_a_message(flow_env, prefect_harness):
    root, seen, adapt = flow_env["root"], flow_env["seen"], flow_env["flow"]
    RELEASE.clear()
    first: dict = {}
    worker = threading.Thread(target=lambda: first.update(state=adapt(root=str(root), push=False, return_state=True)))
    worker.start()
    try:
        assert RUNNING.wait(120), "the first run never reached its pipeline"
        second = adapt(root=str(root), push=False, return_state=True)
    finally:
        RELEASE.set()
        worker.join(120)
    assert second.is_completed() and second.name == "Skipped"
    assert second.message == f"skipped: an adapt run is already going in {root} (.aiayn/adapt.lock is held)"
    assert first["state"].is_completed(), first["state"].message
    assert len(seen["pipeline"]) == 1 and len(seen["gate"]) == 1


def test_params_left_adapted_by_a_killed_run_are_put_back_first(flow_env, prefect_harness):
    """A kill -9 inside the adapted run never reaches the ``finally`` that restores params.yaml: the next
    adapt or pipeline run puts the original back, but not while an adaptation holds the lock."""
    from aiayn.adaptation.adapt_plan import PARAMS_BACKUP, restore_interrupted_adaptation
    from pipelines.adapt_flow import adapted_params_file

    root, adapt = flow_env["root"], flow_env["flow"]
    before = (root / "params.yaml").read_text()
    killed = adapted_params_file(root / "params.yaml", {"train.init_from": "models:/m@champion"})
    killed.__enter__()  # the process dies here: its finally never runs
    assert "models:/m@champion" in (root / "params.yaml").read_text() and (root / PARAMS_BACKUP).is_file()
    with adapt_lock(root):
        assert not restore_interrupted_adaptation(root)  # an adaptation running: its params stay adapted
    assert restore_interrupted_adaptation(root) and (root / "params.yaml").read_text() == before
    assert not (root / PARAMS_BACKUP).exists() and not restore_interrupted_adaptation(root)
    killed = adapted_params_file(root / "params.yaml", {"train.init_from": "models:/m@champion"})
    killed.__enter__()
    state = adapt(root=str(root), push=False, return_state=True)  # the flow restores before it reads params
    assert state.is_completed(), state.message
    assert (root / "params.yaml").read_text() == before and not (root / PARAMS_BACKUP).exists()


def test_a_failed_pipeline_fails_the_run_and_keeps_params_and_state(flow_env, prefect_harness):
    root, seen, adapt = flow_env["root"], flow_env["seen"], flow_env["flow"]
    before = (root / "params.yaml").read_text()
    seen["fail"] = True
    state = adapt(root=str(root), push=False, return_state=True)
    assert state.is_failed()
    assert state.message == ("adaptation failed, the champion is untouched: the adapted pipeline did not complete: "
                             "stage train failed")
    assert (root / "params.yaml").read_text() == before and not (root / STATE_FILE).exists() and not seen["gate"]


def test_the_flow_refuses_to_adapt_without_a_champion(flow_env, prefect_harness):
    root, seen, adapt = flow_env["root"], flow_env["seen"], flow_env["flow"]
    uri = f"sqlite:///{(root / 'mlflow.db').as_posix()}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).delete_registered_model_alias(NAME, "champion")
    state = adapt(root=str(root), push=False, return_state=True)
    assert state.is_failed() and "champion" in state.message and "not found" in state.message, state.message
    assert not seen["pipeline"] and not (root / STATE_FILE).exists()


def test_the_deployment_runs_one_adaptation_at_a_time(tmp_path):
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    from pipelines.deploy import build_deployments

    (daily,) = [d for d in build_deployments(tmp_path) if d.name == "daily"]
    assert daily.flow_name == "adapt" and daily.entrypoint == "pipelines.adapt_flow.adapt"
    (schedule,) = daily.schedules
    assert schedule.schedule.cron == "0 4 * * *" and schedule.schedule.timezone == "UTC"
    assert daily.concurrency_limit == 1
    assert daily.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.CANCEL_NEW
    assert daily.parameters == {"root": str(tmp_path.resolve()), "push": True}
