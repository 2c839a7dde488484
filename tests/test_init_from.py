"""Continued training from a parent model (``train.init_from``, ``train.finetune``; docs/training.md, "Continued
training"), on the tiny world of tests/support/tiny.py: a parent model folder and a new corpus of the same words.

1. a folder parent: step 0 is the parent's tensors, the vocabulary is its spm bytes, the run records the parent
   (tags, ``model.json``, ``artifacts/parent_model.json``) and early stopping on the new validation split works;
2. a model block that contradicts the parent's, a vocabulary or weights that cannot be loaded: one line each;
3. the unknown-piece rate of the new corpus under the parent's spm: refused above ``max_unk_rate``, warned above
   ``warn_unk_rate``;
4. the optimizer and schedule start fresh (step 1's lr, the peak, Adam's step count);
5. replay mixes the parent's pairs at the configured share, a pure function of ``(data_seed, epoch)``;
6. ``init_from: null`` trains exactly as the plain loop does, with the fingerprint a run had before this feature;
7. ``models:/NAME@ALIAS`` resolves through a SQLite MLflow registry (a CTranslate2 bundle: the float weights come
   from the train run of the pipeline run that registered it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from support import tiny
from aiayn.checkpoint import list_checkpoints, load_checkpoint, load_model_weights, save_model
from aiayn.config.checks import check_params
from aiayn.config.schema import ConfigError, params_from_dict
from aiayn.data.replay import ReplayBatchIterator, join_splits, replay_count
from aiayn.inference.runtimes import DecodeOptions
from aiayn.init_from import ParentModelError
from aiayn.recording import NullRun
from aiayn.io import sha256_file
from aiayn.stages import Layout
from aiayn.stages import tokenize as tokenize_stage
from aiayn.stages import train as train_stage
from aiayn.stages.train_job import data_id, load_train_inputs
from aiayn.tokenizer import UNK_ID, EncodedSplit, encoded_files, load_encoded
from aiayn.train import Trainer, config_fingerprint, learning_rate, lr_schedule, train

ARCH = {"preset": "tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 2, "max_positions": 320, "norm": "post"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tokenizer and the parent project (``tiny.project``: its model folder and prepared splits)."""
    root = tmp_path_factory.mktemp("init-from")
    tok = tiny.tokenizer(root)
    return {"root": root, "tok": tok, "parent": tiny.project(root / "parent", tok)}


def _params(init_from: str | None, model: dict | None = None, **train):
    base = {"max_steps": 4, "max_tokens": 256, "warmup_steps": 8, "lr_decay": "inverse_sqrt", "validate_every": 2,
            "checkpoint_every": 2, "keep_checkpoints": 2, "average_last": 1, "log_every": 1, "device": "cpu",
            "valid_bleu": {"enabled": False}, "init_from": init_from}
    return params_from_dict({"data": {"test_splits": ["test_a"]}, "tokenize": {"vocab_size": 120},
                             "quantize": {"gate_split": "test_a"}, "model": ARCH | (model or {}),
                             "train": base | train})


def _new_project(root: Path, extra: str = "", every: int = 0) -> Layout:
    """A new corpus (the same words, other sentences) under ``root``; ``extra`` appended to the source of every
    ``every``-th training line (``every`` 1: replaces the whole training text)."""
    layout = Layout(root)
    layout.prepared.mkdir(parents=True)
    for split, (n, seed) in {"train": (48, 20), "val": (12, 21), "test_a": (8, 22)}.items():
        en, de = tiny.corpus(n, seed)
        if split == "train" and every == 1:
            en, de = [extra] * n, [extra] * n
        elif split == "train" and every:
            en = [f"{s} {extra}" if i % every == 0 else s for i, s in enumerate(en)]
        (layout.prepared / f"{split}.en").write_text("\n".join(en) + "\n")
        (layout.prepared / f"{split}.de").write_text("\n".join(de) + "\n")
    return layout


class _TagSpy:
    """A recorder that records nothing but the tags (checked as MLflow would, by ``NullRun``)."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    @contextlib.contextmanager
    def start(self, record):
        run = NullRun()
        check = run.set_tags

        def set_tags(tags):
            check(tags)
            self.tags.update({k: str(v) for k, v in tags.items()})

        run.set_tags = set_tags
        yield run


def _init_problems(params, root: Path | None = None) -> list[str]:
    """``aiayn check``'s lines about ``train.init_from`` (the tiny projects have no corpus folder to check)."""
    return [p for p in check_params(params, root) if "init_from" in p or "replay" in p]


def _folder_copy(world, where: Path) -> Path:
    shutil.copytree(world["parent"].model, where)
    return where


# --------------------------------------------------------------------------- 1. a folder parent


def test_init_from_a_folder_keeps_the_parents_weights_vocabulary_and_records_it(world, tmp_path):
    parent_dir = world["parent"].model
    layout = _new_project(tmp_path / "new")
    params = _params(str(parent_dir), max_steps=8, early_stop={"metric": "valid_loss", "patience": 1, "min_delta": 100})
    assert _init_problems(params, layout.root) == []
    meta = tokenize_stage.run(params, layout)
    assert (layout.tokenized / "spm.model").read_bytes() == (parent_dir / "spm.model").read_bytes()
    assert meta["parent"]["weights_sha256"] == sha256_file(parent_dir / "model.safetensors")
    assert meta["parent"]["uri"] == str(parent_dir) and 0.0 <= meta["unk_rate"]["train"] < 0.01

    inputs = load_train_inputs(params, layout)
    trainer = Trainer(inputs.model_cfg, inputs.train_cfg, inputs.train_split, inputs.valid_split, tmp_path / "ck",
                      data_id=inputs.data_id, **inputs.trainer_options())
    trainer.setup()
    parent = load_model_weights(parent_dir / "model.safetensors")
    step0 = trainer.model.state_dict()
    assert set(step0) == set(parent) and all(torch.equal(step0[k], parent[k]) for k in parent), "step 0 is the parent"

    spy = _TagSpy()
    summary = train_stage.run(params, layout, spy)
    tags = spy.tags
    assert (summary["stopped_by"], summary["step"]) == ("early_stop", 4), summary  # the new domain's validation
    assert (layout.model / "spm.model").read_bytes() == (parent_dir / "spm.model").read_bytes()
    assert tags["aiayn.parent_model"] == str(parent_dir) and tags["aiayn.parent_weights_sha256"] == sha256_file(
        parent_dir / "model.safetensors")
    record = json.loads(layout.parent_model.read_text())
    assert record["init_from"] == str(parent_dir) and record["weights_sha256"] == tags["aiayn.parent_weights_sha256"]
    assert json.loads((layout.model / "model.json").read_text())["adapted_from"] == record

    from aiayn.export.model_card import render_card

    card = {"name": "n", "variant": "v", "description": "d", "why": "w", "scores": {}, "provenance":
            {"adapted_from": record}, "runtime": "eager", "decode": {}, "limits": [], "params": {}}
    assert f"adapted from `{parent_dir}`" in render_card(card)


# --------------------------------------------------------------------------- 2. refusals, one line each


def test_a_model_block_that_contradicts_the_parent_is_refused_naming_the_keys(world, tmp_path):
    layout = _new_project(tmp_path / "new")
    params = _params(str(world["parent"].model), model={"d_model": 64, "n_layers": 3})
    [problem] = _init_problems(params, layout.root)
    assert "d_model: 64 (parent 32)" in problem and "n_layers: 3 (parent 2)" in problem and "\n" not in problem
    assert "d_ff" not in problem and "dropout" not in problem
    with pytest.raises(ParentModelError, match="d_model: 64 .parent 32.; n_layers: 3"):
        tokenize_stage.run(params, layout)
    assert not layout.tokenized.exists()
    ok = _params(str(world["parent"].model), model={"dropout": 0.3})  # a training choice, not the architecture
    assert _init_problems(ok, layout.root) == []


def test_a_parent_that_cannot_be_loaded_is_named_in_one_line(world, tmp_path):
    layout = _new_project(tmp_path / "new")
    broken = _folder_copy(world, tmp_path / "broken-spm")
    (broken / "spm.model").write_bytes(b"not a sentencepiece model")
    [problem] = _init_problems(_params(str(broken)), layout.root)
    assert "vocabulary" in problem and str(broken / "spm.model") in problem and "\n" not in problem

    unfit = _folder_copy(world, tmp_path / "unfit")  # weights of another width under the same model.json
    save_model(unfit / "model.safetensors", tiny.model(world["tok"], d_ff=48).state_dict())
    params = _params(str(unfit))
    tokenize_stage.run(params, layout)  # the vocabulary is fine: the weights are read by the train stage
    with pytest.raises(ParentModelError) as refused:
        load_train_inputs(params, layout)
    message = str(refused.value)
    assert "do not fit" in message and str(unfit / "model.safetensors") in message and "\n" not in message

    bundle = tiny.ct2_bundle(tmp_path, world["parent"], world["tok"], DecodeOptions(beam_size=1))
    [problem] = _init_problems(_params(str(bundle)), layout.root)
    assert "CTranslate2 serving bundle without float weights" in problem
    with pytest.raises(ParentModelError, match="this run was not handed"):
        tokenize_stage.run(_params("models:/aiayn-en-de@champion"), layout)  # NullRecorder: no registry
    with pytest.raises(ConfigError, match="models:/NAME@ALIAS or models:/NAME/VERSION"):
        _params("models:/aiayn-en-de")


# --------------------------------------------------------------------------- 3. unknown pieces


def _unk_share(layout: Layout) -> float:
    split = load_encoded(layout.tokenized, "train")
    ids = np.concatenate([split.src_ids, split.tgt_ids])
    return float(np.count_nonzero(ids == UNK_ID) / len(ids))


def test_a_mostly_unknown_corpus_is_refused_and_a_partly_unknown_one_warned(world, tmp_path, caplog):
    greek = _new_project(tmp_path / "greek", extra="Ένας σκύλος τρέχει στο πάρκο με μια κόκκινη μπάλα", every=1)
    with pytest.raises(ParentModelError) as refused:
        tokenize_stage.run(_params(str(world["parent"].model)), greek)
    message = str(refused.value)
    assert "unknown to the parent's sentencepiece model" in message and "max_unk_rate 5.00%" in message
    rate = float(message.split("init_from ")[1].split(": ")[1].split("%")[0])
    assert rate > 5.0 and "\n" not in message
    assert not greek.tokenized.exists(), "a refused corpus leaves no tokenized output"

    some = _new_project(tmp_path / "some", extra="ωμέγα", every=4)
    params = _params(str(world["parent"].model), finetune={"warn_unk_rate": 0.001, "max_unk_rate": 0.5})
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        meta = tokenize_stage.run(params, some)
    measured = _unk_share(some)
    assert 0.001 < measured < 0.5 and meta["unk_rate"]["train"] == pytest.approx(measured, abs=1e-6)
    [warning] = [r.getMessage() for r in caplog.records if "unknown to the parent" in r.getMessage()]
    assert f"{100 * measured:.2f}%" in warning and "warn_unk_rate 0.10%" in warning


# --------------------------------------------------------------------------- 4. a fresh optimizer and schedule


def test_the_optimizer_and_schedule_start_fresh(world, tmp_path):
    layout = _new_project(tmp_path / "new")
    params = _params(str(world["parent"].model), warmup_steps=40, lr_scale=2.0,
                     finetune={"warmup_steps": 10, "lr_scale": 0.5})
    tokenize_stage.run(params, layout)
    inputs = load_train_inputs(params, layout)
    cfg = inputs.train_cfg
    base, fresh = lr_schedule(params.train, 32), lr_schedule(cfg, 32)
    assert fresh(10) == pytest.approx(0.5 * base(40), rel=1e-12), "peak: lr_scale x the train block's own peak"
    assert max(fresh(s) for s in range(1, 200)) == pytest.approx(fresh(10), rel=1e-12)
    trainer = Trainer(inputs.model_cfg, cfg, inputs.train_split, inputs.valid_split, tmp_path / "ck",
                      data_id=inputs.data_id, **inputs.trainer_options())
    trainer.setup()
    assert trainer.result.step == 0 and not trainer.optimizer.state, "no moments carried over"
    trainer.step()
    lr1 = learning_rate(1, d_model=32, warmup_steps=10, lr_scale=2.0 * 0.5 * (10 / 40) ** 0.5)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [pytest.approx(lr1, rel=1e-12)] * len(
        trainer.optimizer.param_groups)
    assert lr1 == pytest.approx(base(40) * 0.5 / 10, rel=1e-12)  # a tenth of the way up the fresh warmup
    assert {int(s["step"]) for s in trainer.optimizer.state.values()} == {1}
    assert trainer.fingerprint != config_fingerprint(inputs.model_cfg, params.train, data_id(layout, "train")), \
        "a from-scratch run's checkpoints are not resumed by the continued one"


# --------------------------------------------------------------------------- 5. replay


def _toy_split(n: int, offset: int) -> EncodedSplit:
    rng = np.random.default_rng(offset)
    rows = [list(rng.integers(4, 100, size=int(rng.integers(2, 9)))) for _ in range(n)]
    return EncodedSplit.from_lists(rows, rows)


def test_replay_draws_the_configured_share_from_data_seed_and_epoch_alone():
    new, pool = _toy_split(40, 1), _toy_split(30, 2)
    joined = join_splits(new, pool)
    assert [list(joined.src(i)) for i in (0, 39, 40, 69)] == [list(new.src(0)), list(new.src(39)), list(pool.src(0)),
                                                            list(pool.src(29))]
    it = ReplayBatchIterator(joined, n_new=40, share=0.25, max_tokens=64, data_seed=3)
    assert it.per_epoch == replay_count(40, 0.25) == 13
    seen = np.concatenate([it.next_indices() for _ in range(it.batches_in_epoch)])
    assert sorted(seen) == sorted(it.epoch_pairs(1)), "an epoch's batches hold exactly its pairs"
    assert sorted(seen[seen < 40]) == list(range(40)) and len(set(seen[seen >= 40])) == 13
    assert (seen >= 40).mean() == pytest.approx(0.25, abs=1 / 53)
    again = ReplayBatchIterator(joined, n_new=40, share=0.25, max_tokens=64, data_seed=3)
    assert np.array_equal(np.concatenate([again.next_indices() for _ in range(again.batches_in_epoch)]), seen)
    assert not np.array_equal(np.sort(it.epoch_pairs(2)), np.sort(it.epoch_pairs(1))), "each epoch draws anew"
    other_seed = ReplayBatchIterator(joined, n_new=40, share=0.25, max_tokens=64, data_seed=4)
    assert not np.array_equal(np.sort(other_seed.epoch_pairs(1)), np.sort(it.epoch_pairs(1)))
    resumed = ReplayBatchIterator(joined, n_new=40, share=0.25, max_tokens=64, data_seed=3)
    first = ReplayBatchIterator(joined, n_new=40, share=0.25, max_tokens=64, data_seed=3)
    [first.next_indices() for _ in range(3)]
    resumed.load_state_dict(first.state_dict())
    assert all(np.array_equal(first.next_indices(), resumed.next_indices()) for _ in range(it.batches_in_epoch + 2))
    many = ReplayBatchIterator(joined, n_new=40, share=0.9, max_tokens=64, data_seed=3)
    counts = np.bincount(many.epoch_pairs(1)[40:] - 40, minlength=30)
    assert many.per_epoch == 360 and set(counts) == {12}, "a small pool is cycled through evenly"


def test_the_stage_replays_the_parents_training_pairs(world, tmp_path):
    layout = _new_project(tmp_path / "new")
    replay = world["parent"].prepared / "train"
    params = _params(str(world["parent"].model), finetune={"replay_share": 0.5, "replay_path": str(replay)})
    meta = tokenize_stage.run(params, layout)
    assert meta["replay"]["n"] == 64 and meta["replay"]["src_sha256"] == sha256_file(replay.with_suffix(".en"))
    inputs = load_train_inputs(params, layout)
    assert len(inputs.train_split) == 48 + 64 and inputs.trainer_options()["replay"] == (48, 0.5)
    assert ",replay:" in inputs.data_id
    trainer = Trainer(inputs.model_cfg, inputs.train_cfg, inputs.train_split, inputs.valid_split, tmp_path / "ck",
                      data_id=inputs.data_id, **inputs.trainer_options())
    trainer.setup()
    pairs = trainer.iterator.epoch_pairs(1)
    assert (pairs >= 48).sum() == 48 == replay_count(48, 0.5)
    parent_src = load_encoded(layout.tokenized, "parent_replay")
    drawn = int(pairs[pairs >= 48][0])
    assert list(inputs.train_split.src(drawn)) == list(parent_src.src(drawn - 48))
    with pytest.raises(ConfigError, match="replay_path"):
        _params(str(world["parent"].model), finetune={"replay_share": 0.5})
    with pytest.raises(ConfigError, match="needs train.init_from"):
        _params(None, finetune={"replay_share": 0.5, "replay_path": "x"})


# --------------------------------------------------------------------------- 6. init_from: null


def test_init_from_null_trains_exactly_as_the_plain_loop(world, tmp_path):
    layout = _new_project(tmp_path / "stage")
    params = _params(None, max_steps=6)
    meta = tokenize_stage.run(params, layout)
    assert "parent" not in meta and not (layout.tokenized / "parent.json").exists()
    train_stage.run(params, layout)
    assert json.loads(layout.parent_model.read_text()) == {"init_from": None}
    assert "adapted_from" not in json.loads((layout.model / "model.json").read_text())

    # the plain loop, as the train stage ran it before continued training existed: no parent, no replay
    plain = Layout(tmp_path / "plain")
    shutil.copytree(layout.tokenized, plain.tokenized)
    vocab = world["tok"].vocab_size
    model_cfg = params.model.model_copy(update={"vocab_size": vocab})
    result = train(model_cfg, params.train, load_encoded(plain.tokenized, "train", vocab_size=vocab),
                   load_encoded(plain.tokenized, "val", vocab_size=vocab), plain.checkpoints,
                   data_id=data_id(plain, "train"))
    assert result.step == 6
    mine, theirs = (load_checkpoint(list_checkpoints(d)[-1]) for d in (layout.checkpoints, plain.checkpoints))
    assert mine.step == theirs.step == 6 and mine.fingerprint == theirs.fingerprint
    assert all(torch.equal(mine.model[k], theirs.model[k]) for k in theirs.model), "bitwise the same weights"
    assert all(torch.equal(a, b) for k in theirs.optimizer["state"] for a, b in zip(
        mine.optimizer["state"][k].values(), theirs.optimizer["state"][k].values()) if torch.is_tensor(a))

    class PreFeature:  # a TrainConfig as it was before train.init_from / train.finetune existed
        optimizer, init_from = params.train.optimizer, None

        def model_dump(self, mode="json"):
            return {k: v for k, v in params.train.model_dump(mode=mode).items() if k not in ("init_from", "finetune")}

    assert mine.fingerprint == config_fingerprint(model_cfg, PreFeature(), data_id(plain, "train")), \
        "checkpoints written before the feature still resume"


def test_a_tokenized_corpus_of_a_parent_is_not_trained_from_scratch(world, tmp_path):
    layout = _new_project(tmp_path / "new")
    tokenize_stage.run(_params(str(world["parent"].model)), layout)
    with pytest.raises(ParentModelError, match="rerun the tokenize stage"):
        load_train_inputs(_params(None), layout)
    other = _folder_copy(world, tmp_path / "other-parent")
    with pytest.raises(ParentModelError, match="not train.init_from"):
        load_train_inputs(_params(str(other)), layout)
    save_model(other / "model.safetensors", {k: v + 1.0 for k, v in tiny.model(world["tok"]).state_dict().items()})
    tokenize_stage.run(_params(str(other)), layout)
    (other / "model.safetensors").write_bytes((world["parent"].model / "model.safetensors").read_bytes())
    with pytest.raises(ParentModelError, match="changed since the tokenize stage"):
        load_train_inputs(_params(str(other)), layout)


# --------------------------------------------------------------------------- 7. a registered parent


@pytest.fixture
def _clean_env(monkeypatch, tmp_path):
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def test_a_registered_alias_resolves_through_a_sqlite_registry(world, tmp_path, _clean_env):
    """The default bundle is CTranslate2 (no float weights): the parent's weights come from the ``model/`` folder
    the train stage logged in the pipeline run that registered the version."""
    from mlflow import MlflowClient

    from aiayn.export.bundle import register_bundle
    from aiayn.tracking import MlflowRecorder, Tracker

    store = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    parent = world["parent"]
    ct2 = tiny.ct2_bundle(tmp_path, parent, world["tok"], DecodeOptions(beam_size=1, max_len_b=6))
    project = tmp_path / "parent-pipeline"
    project.mkdir()
    with Tracker("train", project_root=project, tracking_uri=store) as t:
        t.log_artifacts(parent.model, artifact_path="model")
    with Tracker("export", project_root=project, tracking_uri=store, end_pipeline=True) as t:
        registered = register_bundle(t, ct2, name="aiayn-en-de", variant="ct2-float32", gate_split="test_a",
                                     bleu=30.0, example=["a man"])
    assert registered["alias"] == "champion"
    version_run = MlflowClient(tracking_uri=store).get_model_version("aiayn-en-de", "1").run_id

    layout = _new_project(tmp_path / "new")
    params = _params("models:/aiayn-en-de@champion")
    recorder = MlflowRecorder(layout.root, tracking_uri=store)
    meta = tokenize_stage.run(params, layout, recorder)
    assert (meta["parent"]["uri"], meta["parent"]["version"], meta["parent"]["run_id"]) == (
        "models:/aiayn-en-de@champion", "1", version_run)
    assert meta["parent"]["weights_sha256"] == sha256_file(parent.model / "model.safetensors")
    assert (layout.tokenized / "spm.model").read_bytes() == (parent.model / "spm.model").read_bytes()
    kept = layout.root / ".aiayn" / "parents" / "aiayn-en-de" / "v1"
    assert json.loads((kept / "resolved.json").read_text())["weights_from"] == "train run"
    wider = params.model_copy(update={"model": params.model.model_copy(update={"d_model": 64})})
    [problem] = _init_problems(wider, layout.root)  # a registered parent: the one tokenize recorded is checked
    assert "d_model: 64 (parent 32)" in problem

    def no_registry(*args):
        raise AssertionError("the train stage continues the version tokenize resolved, from the kept copy")

    recorder.resolve_registered_model = no_registry
    train_stage.run(params, layout, recorder)
    del recorder.resolve_registered_model  # the recorder's own again
    record = json.loads(layout.parent_model.read_text())
    assert record == {"init_from": "models:/aiayn-en-de@champion", "version": "1", "run_id": version_run,
                      "weights_sha256": meta["parent"]["weights_sha256"], "spm_sha256": meta["parent"]["spm_sha256"]}
    client = MlflowClient(tracking_uri=store)
    [run] = [r for r in client.search_runs([client.get_experiment_by_name("aiayn").experiment_id])
             if r.info.run_name == "train" and "aiayn.parent_model" in r.data.tags]
    tags = run.data.tags
    assert (tags["aiayn.parent_model"], tags["aiayn.parent_version"], tags["aiayn.parent_run_id"]) == (
        "models:/aiayn-en-de@champion", "1", version_run)
    for f in encoded_files(layout.tokenized, "train"):
        assert f.is_file()
    with pytest.raises(ParentModelError, match="models:/aiayn-en-de/7 not found") as missing:
        tokenize_stage.run(_params("models:/aiayn-en-de/7"), layout, recorder)
    assert "\n" not in str(missing.value)
