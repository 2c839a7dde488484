"""The two-sided promotion gate (aiayn.adaptation): the decision (gain on the new domain AND bounded loss on every
old split; signatures must match), the gate run that scores both bundles with the evaluate stage's code and
records its numbers, and what the decision does to a SQLite MLflow registry (a refusal leaves the champion
where it was; a promotion goes through the champion history). Plus the export's registration of an adapted
model as challenger, whatever its BLEU."""

from __future__ import annotations

import json
import contextlib
from pathlib import Path

import pytest
from mlflow import MlflowClient

from support import tiny
from aiayn.adaptation.gate_run import gate_dir, promotion_gate, run_gate
from aiayn.adaptation.promotion_gate import GateError, decide, gate_metrics, summary_line
from aiayn.checkpoint import save_model
from aiayn.config.adaptation import AdaptConfig, AdaptGateConfig
from aiayn.config.schema import EvalConfig, Params
from aiayn.export.bundle import build_bundle
from aiayn.export.model_card import render_card
from aiayn.inference.artifacts import EAGER
from aiayn.inference.runtimes import DecodeOptions
from aiayn.recording import NullRun, StageRecord
from aiayn.tracking import CHALLENGER, CHAMPION, RegistryError, choose_alias
from aiayn.tracking.champion_history import history
from aiayn.tracking.promotion import GATE_ACTOR, apply_gate_decision

NAME = "aiayn-en-de"
SIG = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
OPTIONS = DecodeOptions(beam_size=1, max_len_b=8)


def _scores(**bleu: float) -> dict[str, dict]:
    return {split: {"bleu": b, "bleu_signature": SIG, "chrf": 50.0} for split, b in bleu.items()}


def _decide(challenger: dict, parent: dict, **kw) -> dict:
    rule = {"new_domain_split": "news", "old_splits": ("flickr", "coco"), "gain_min": 1.0, "loss_max": 0.5} | kw
    return decide(challenger, parent, **rule)


# --------------------------------------------------------------------------- the decision (pure)


def test_a_gain_below_gain_min_is_refused_with_its_numbers():
    d = _decide(_scores(news=30.9, flickr=40.0, coco=30.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    assert d["promote"] is False
    assert d["new_domain"] == {"split": "news", "challenger": 30.9, "parent": 30.0, "gain": 0.9}
    assert d["reasons"] == ["news: gained +0.90 BLEU (30.00 -> 30.90), needs >= 1.00"]
    assert [o["loss"] for o in d["old"]] == [0.0, 0.0] and (d["gain_min"], d["loss_max"]) == (1.0, 0.5)
    assert summary_line(d) == "champion kept: news: gained +0.90 BLEU (30.00 -> 30.90), needs >= 1.00"


def test_a_loss_above_loss_max_on_one_old_split_is_refused_naming_that_split():
    d = _decide(_scores(news=35.0, flickr=40.0, coco=29.4), _scores(news=30.0, flickr=40.2, coco=30.0))
    assert d["promote"] is False
    assert d["old"] == [{"split": "flickr", "challenger": 40.0, "parent": 40.2, "loss": 0.2},
                        {"split": "coco", "challenger": 29.4, "parent": 30.0, "loss": 0.6}]
    assert d["reasons"] == ["coco: lost 0.60 BLEU (30.00 -> 29.40), at most 0.50 allowed"]  # flickr's 0.2 is fine


def test_both_sides_fine_promotes_and_ties_pass():
    d = _decide(_scores(news=31.0, flickr=39.5, coco=30.3), _scores(news=30.0, flickr=40.0, coco=30.0))
    assert d["promote"] is True and d["new_domain"]["gain"] == 1.0 and d["old"][0]["loss"] == 0.5
    assert d["signatures"] == {"news": SIG, "flickr": SIG, "coco": SIG}
    assert summary_line(d).startswith("promoted: news: gained +1.00 BLEU (>= 1.00)")
    assert "largest loss +0.50 on flickr" in d["reasons"][0]
    both_bad = _decide(_scores(news=30.0, flickr=38.0, coco=30.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    assert [r.split(":")[0] for r in both_bad["reasons"]] == ["news", "flickr"]  # every failed condition, named


def test_mismatched_signatures_are_never_compared():
    other = SIG.replace("tok:13a", "tok:intl")
    challenger = _scores(news=40.0, flickr=40.0, coco=30.0)
    challenger["coco"]["bleu_signature"] = other
    with pytest.raises(GateError, match="signatures differ on coco") as e:
        _decide(challenger, _scores(news=30.0, flickr=40.0, coco=30.0))
    assert other in str(e.value) and SIG in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(GateError, match="parent has no score for test split 'news'"):
        _decide(challenger, _scores(flickr=40.0, coco=30.0))
    unsigned = _scores(news=40.0, flickr=40.0, coco=30.0)
    del unsigned["news"]["bleu_signature"]
    with pytest.raises(GateError, match="without a signature"):
        _decide(unsigned, _scores(news=30.0, flickr=40.0, coco=30.0))


def test_the_config_block_refuses_what_the_gate_cannot_use():
    with pytest.raises(ValueError, match="also in adapt.gate.old_splits"):
        AdaptGateConfig(new_domain_split="a", old_splits=("a", "b"))
    with pytest.raises(ValueError, match="old_splits is empty"):
        AdaptGateConfig(old_splits=())
    cfg = AdaptConfig()
    assert (cfg.gate.gain_min, cfg.gate.loss_max, cfg.trigger.drift_windows, cfg.trigger.reviewed_pairs) == (1.0, 0.5, 3, 500)
    assert cfg.gate.old_splits == ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


def test_the_card_shows_the_gate_with_its_numbers():
    d = _decide(_scores(news=30.5, flickr=40.0, coco=29.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    card = tiny.CARD | {"variant": "eager", "runtime": "eager", "decode": {}, "promotion_gate": d | {"models": {
        "challenger": f"models:/{NAME}/2", "parent": f"models:/{NAME}/1"}}}
    md = render_card(card)
    section = md.split("## Promotion gate", 1)[1].split("## Provenance", 1)[0]
    assert "not promoted: the champion was kept" in section and f"challenger models:/{NAME}/2, parent" in section
    assert "| news | new domain | 30.50 | 30.00 | +0.50 |" in section and "| coco | old | 29.00 | 30.00 | -1.00 |" in section
    assert "- coco: lost 1.00 BLEU (30.00 -> 29.00), at most 0.50 allowed" in section and SIG in section
    assert "## Promotion gate" not in render_card({k: v for k, v in card.items() if k != "promotion_gate"})


# --------------------------------------------------------------------------- the gate run: two real bundles


class SpyRun(NullRun):
    run_id = "spy-run"

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def log_metrics(self, metrics, step):
        super().log_metrics(metrics, step)
        self.calls.append(("metrics", dict(metrics)))

    def set_tags(self, tags):
        super().set_tags(tags)
        self.calls.append(("tags", dict(tags)))

    def log_artifacts(self, directory, artifact_path=None):
        super().log_artifacts(directory, artifact_path)
        self.calls.append(("artifacts", sorted(p.name for p in Path(directory).iterdir())))


class SpyRecorder:
    def __init__(self) -> None:
        self.calls: list = []

    @contextlib.contextmanager
    def start(self, record: StageRecord):
        self.calls.append(("start", record.stage))
        yield SpyRun(self.calls)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A tiny project whose model scores BLEU 100 on test_a (its references are that model's greedy output), its
    eager bundle (the challenger) and the eager bundle of another model (pre-norm: other outputs; the parent)."""
    root = tmp_path_factory.mktemp("gate")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    card = tiny.CARD | {"scores": {}}
    challenger = build_bundle(layout.export, model_dir=layout.model, variant=EAGER, variant_dir=None,
                              compute_type=None, decode=OPTIONS, card=card)
    other = root / "parent-model"
    other.mkdir()
    m = tiny.model(tok, norm="pre")
    save_model(other / "model.safetensors", m.state_dict())
    (other / "model.json").write_text(json.dumps({"model": m.cfg.model_dump(mode="json"), "seed": 2, "data_seed": 1}))
    (other / "spm.model").write_bytes((layout.model / "spm.model").read_bytes())
    parent = build_bundle(root / "parent", model_dir=other, variant=EAGER, variant_dir=None, compute_type=None,
                          decode=OPTIONS, card=card)
    return {"layout": layout, "challenger": challenger, "parent": parent}


def _params(**gate) -> Params:
    return Params(evaluate=EvalConfig(beam_size=1, max_len_b=8, device="cpu"),
                  adapt=AdaptConfig(gate=AdaptGateConfig(new_domain_split="test_a", old_splits=("test_b",), **gate)))


@pytest.mark.parametrize("promote", [True, False])
def test_the_gate_scores_both_bundles_in_one_run_and_records_either_outcome(bundles, promote):
    layout, recorder = bundles["layout"], SpyRecorder()
    # the same two models; only the bar moves: gain_min 1 is cleared by far, 1000 cannot be
    params = _params(gain_min=1.0 if promote else 1000.0, loss_max=100.0)
    d = run_gate(params, layout, recorder, parent_bundle=bundles["parent"],
                 models={"challenger": f"models:/{NAME}/2", "parent": f"models:/{NAME}/1"})
    assert d["promote"] is promote and d["run_id"] == "spy-run"
    assert d["new_domain"]["challenger"] == 100.0  # decoded as the evaluate stage does: its own greedy output
    assert d["new_domain"]["parent"] < 90.0 and d["new_domain"]["gain"] > 10.0
    assert d["signatures"]["test_a"].startswith("nrefs:1|case:mixed") and set(d["signatures"]) == {"test_a", "test_b"}
    (start, metrics, tags, artifacts) = recorder.calls
    assert start == ("start", "promotion_gate")
    assert metrics[1] == gate_metrics(d) and metrics[1]["gate.promote"] == float(promote)
    assert metrics[1]["gate.test_a.challenger_bleu"] == 100.0 and metrics[1]["gate.gain"] == d["new_domain"]["gain"]
    assert tags[1]["gate.decision"] == ("promote" if promote else "refuse") and tags[1]["gate.summary"] == d["summary"]
    assert tags[1]["gate.challenger"] == f"models:/{NAME}/2" and tags[1]["gate.test_b.bleu_signature"]
    assert artifacts[1] == ["decision.json", "model_card.json", "model_card.md"]
    written = json.loads((gate_dir(layout) / "decision.json").read_text())
    assert written["promote"] is promote and written["new_domain"] == d["new_domain"]
    md = (gate_dir(layout) / "model_card.md").read_text()
    assert "## Promotion gate" in md and ("promoted to champion" if promote else "the champion was kept") in md
    if not promote:
        assert d["summary"].startswith("champion kept: test_a: gained") and "needs >= 1000.00" in d["summary"]


def test_the_gate_refuses_a_missing_new_domain_split_before_decoding(bundles):
    params = Params(adapt=AdaptConfig(gate=AdaptGateConfig(old_splits=("test_b",))))
    with pytest.raises(GateError, match="new_domain_split is not set"):
        run_gate(params, bundles["layout"], SpyRecorder(), parent_bundle=bundles["parent"])
    missing = _params().model_copy(update={"adapt": AdaptConfig(gate=AdaptGateConfig(
        new_domain_split="test_c", old_splits=("test_b",)))})
    with pytest.raises(GateError, match="not prepared: test_c.en, test_c.de missing"):
        run_gate(missing, bundles["layout"], SpyRecorder(), parent_bundle=bundles["parent"])


# --------------------------------------------------------------------------- the registry (SQLite MLflow store)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A SQLite store with versions 1 (champion) and 2 (challenger) of NAME, registered cheaply (a run's path)."""
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.create_run(client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri()))
    client.create_registered_model(NAME)
    for _ in range(2):
        client.create_model_version(NAME, source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    client.set_registered_model_alias(NAME, CHAMPION, "1")
    client.set_registered_model_alias(NAME, CHALLENGER, "2")
    return {"uri": uri, "client": client}


def _apply(registry, decision, parent_version="1"):
    return apply_gate_decision(decision, name=NAME, version="2", parent_version=parent_version,
                               tracking_uri=registry["uri"], summary=summary_line(decision),
                               metrics=gate_metrics(decision), run_id="gate-run")


def test_a_refusal_leaves_the_champion_untouched_and_records_why(registry):
    client = registry["client"]
    d = _decide(_scores(news=35.0, flickr=40.0, coco=28.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    out = _apply(registry, d)
    assert out == {"promoted": False, "version": "2", "champion_before": "1", "champion": "1", "event": None}
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "1"
    tags = client.get_model_version(NAME, "2").tags
    assert tags["aiayn.promotion_gate"] == "refused" and tags["gate.run_id"] == "gate-run"
    assert tags["gate.summary"] == "champion kept: coco: lost 2.00 BLEU (30.00 -> 28.00), at most 0.50 allowed"
    assert float(tags["gate.gain"]) == 5.0 and float(tags["gate.max_loss"]) == 2.0 and tags["gate.parent_version"] == "1"
    assert not [e for e in history(client, NAME) if e["kind"] == "promote"]


def test_a_promotion_moves_the_champion_through_the_history_with_the_gate_s_numbers(registry):
    client = registry["client"]
    d = _decide(_scores(news=32.0, flickr=39.9, coco=30.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    out = _apply(registry, d)
    assert out["promoted"] is True and (out["champion_before"], out["champion"]) == ("1", "2")
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "2"
    (event,) = [e for e in history(client, NAME) if e["kind"] == "promote"]
    assert (event["from_version"], event["to_version"], event["actor"]) == ("1", "2", GATE_ACTOR)
    assert event["reason"] == summary_line(d) and event["run_id"] == "gate-run"
    assert event["metrics"]["gate.gain"] == 2.0 and event["metrics"]["gate.flickr.loss"] == pytest.approx(0.1)
    assert client.get_model_version(NAME, "2").tags["aiayn.promotion_gate"] == "promoted"


def test_a_champion_that_moved_while_the_gate_ran_is_not_replaced(registry):
    client = registry["client"]
    d = _decide(_scores(news=32.0, flickr=40.0, coco=30.0), _scores(news=30.0, flickr=40.0, coco=30.0))
    with pytest.raises(RegistryError, match="moved from version 3 to 1 while the gate ran"):
        _apply(registry, d, parent_version="3")
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "1"
    assert "aiayn.promotion_gate" not in client.get_model_version(NAME, "2").tags


def test_an_adapted_model_registers_as_challenger_and_the_gate_decides(bundles, tmp_path, monkeypatch):
    """The export stage's registration of a model with train.init_from: challenger, even above the champion's
    BLEU (the plain rule still moves the champion for a model trained from scratch); then the gate, on the
    registered bundles: a refusal leaves the champion, a promotion moves it."""
    from aiayn.export.bundle import register_bundle
    from aiayn.stages.export import registry_provenance
    from aiayn.tracking import Tracker

    assert choose_alias(50.0, 10.0, gated=True) == CHALLENGER and choose_alias(50.0, 10.0) == CHAMPION
    prov = registry_provenance({}, "c0ffee", False, init_from=f"models:/{NAME}@champion")
    assert prov["aiayn.promotion_gate"] == "pending" and prov["train.init_from"] == f"models:/{NAME}@champion"
    assert "aiayn.promotion_gate" not in registry_provenance({}, "c0ffee", False)
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"

    def register(bundle, bleu, provenance):
        with Tracker("export", project_root=tmp_path, tracking_uri=uri, end_pipeline=True) as t:
            return register_bundle(t, bundle, name=NAME, variant=EAGER, gate_split="test_a", bleu=bleu,
                                   example=["a man"], provenance=provenance)

    assert register(bundles["parent"], 10.0, registry_provenance({}, "c0ffee", False))["alias"] == CHAMPION
    adapted = register(bundles["challenger"], 50.0, prov)
    assert adapted["alias"] == CHALLENGER
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "1"
    assert client.get_model_version(NAME, adapted["version"]).tags["aiayn.promotion_gate"] == "pending"

    # then the gate, as the adapt flow calls it: the challenger found by the exported bundle's digest, the
    # champion's bundle downloaded, both scored, the run nested under the adapted pipeline run
    pipeline_run = client.create_run(client.create_experiment("adapt", artifact_location=(tmp_path / "x").as_uri()))
    layout, parent_id = bundles["layout"], pipeline_run.info.run_id
    kept = promotion_gate(_params(gain_min=1000.0), layout, name=NAME, tracking_uri=uri, parent_run_id=parent_id)
    assert kept["promote"] is False and kept["registry"]["champion"] == "1"
    assert kept["models"] == {"challenger": f"models:/{NAME}/2", "parent": f"models:/{NAME}/1"}
    assert client.get_model_version(NAME, "2").tags["aiayn.promotion_gate"] == "refused"
    gate_run = client.get_run(kept["run_id"])
    assert gate_run.data.tags["mlflow.parentRunId"] == parent_id and gate_run.data.tags["gate.decision"] == "refuse"
    assert gate_run.data.metrics["gate.test_a.challenger_bleu"] == 100.0
    assert gate_run.data.metrics["gate.gain"] == kept["new_domain"]["gain"] and gate_run.data.metrics["gate.promote"] == 0
    promoted = promotion_gate(_params(gain_min=1.0, loss_max=100.0), layout, name=NAME, tracking_uri=uri)
    assert promoted["promote"] is True and promoted["registry"] | {"event": None} == {
        "promoted": True, "version": "2", "champion_before": "1", "champion": "2", "event": None}
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "2"
    with pytest.raises(RegistryError, match="is the champion already"):
        promotion_gate(_params(), layout, name=NAME, tracking_uri=uri)

    # a nightly retrain (no init_from, far above the adapted champion on the gate split) does not take the
    # champion back by the plain BLEU rule: the gate split cannot see the users' domain; after a rollback it can
    from aiayn.tracking.champion_history import rollback

    def nightly_bundle(k: int) -> Path:  # the challenger's model under another card: another bundle digest
        return build_bundle(tmp_path / f"nightly-{k}", model_dir=layout.model, variant=EAGER, variant_dir=None,
                            compute_type=None, decode=OPTIONS, card=tiny.CARD | {"description": f"nightly retrain {k}"})

    nightly = register(nightly_bundle(1), 99.0, registry_provenance({}, "c0ffee", False))
    assert nightly["alias"] == CHALLENGER and str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "2"
    assert "adapted to its users' domain" in history(client, NAME)[-1]["reason"]
    rollback(client, NAME, tracking_uri=uri)
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "1"
    assert register(nightly_bundle(2), 99.5, registry_provenance({}, "c0ffee", False))["alias"] == CHAMPION
