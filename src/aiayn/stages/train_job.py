"""What the ``train`` stage and its torchrun ranks (``aiayn.stages.train_worker``) share.

Both read the same training inputs from the layout (the tokenizer sizes the model; the
data id enters the checkpoint fingerprint, so a one-process run and a torchrun job resume
each other), and they talk through one job folder: the launcher writes the resolved
params there, rank 0 appends its metrics and writes the run's result there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import CheckpointError, load_model_weights
from aiayn.config.schema import ModelConfig, Params, TrainConfig
from aiayn.data.readers import read_lines
from aiayn.data.replay import join_splits
from aiayn.init_from import (REPLAY_SPLIT, ParentModel, ParentModelError, Resolver, check_architecture,
                             parent_for_training, training_model_config)
from aiayn.io import sha256_file
from aiayn.model import Transformer
from aiayn.stages import Layout
from aiayn.tokenizer import EncodedSplit, Tokenizer, encoded_files, load_encoded
from aiayn.train import TrainResult
from aiayn.train.schedule import finetune_train_config

__all__ = ["PARAMS_FILE", "METRICS_FILE", "RESULT_FILE", "TrainInputs", "load_train_inputs", "data_id",
           "parent_weights", "job_summary", "result_from_job", "bleu_validator"]

#: The resolved ``Params`` (``Params.model_dump_json()``), written by the launcher, read by every rank.
PARAMS_FILE = "params.json"
#: Rank 0's metrics, one ``{"step", "metrics"}`` JSON object per line, read live by the launcher.
METRICS_FILE = "metrics.jsonl"
#: Rank 0's ``job_summary`` of the finished (or interrupted) run.
RESULT_FILE = "result.json"


def data_id(layout: Layout, split: str) -> str:
    """The training data's identity in the checkpoint fingerprint: short SHA-256s of the tokenizer and encoded files."""
    files = ["spm.model", *(p.name for p in encoded_files(layout.tokenized, split))]
    return ",".join(sha256_file(layout.tokenized / f)[:16] for f in files)


@dataclass(frozen=True)
class TrainInputs:
    """A training run's inputs, read from ``layout.tokenized``.

    ``model_cfg`` is ``params.model`` with ``vocab_size`` taken from the tokenizer (a
    hand-written multi-node ``params.json`` need not carry it); ``data_id`` is ``data_id(...)``
    of the training split. With ``train.init_from``: ``parent`` (``aiayn.init_from``), ``model_cfg`` its
    architecture, ``train_cfg`` the fresh schedule (``aiayn.train.schedule.finetune_train_config``; else
    ``params.train`` itself), ``data_id`` also names the parent's weights, and with replay ``train_split`` is the
    new pairs followed by the parent's (``aiayn.data.replay``). ``trainer_options()``: the Trainer's extra arguments.
    """

    spm_path: Path
    model_cfg: ModelConfig
    train_split: EncodedSplit
    valid_split: EncodedSplit
    data_id: str
    train_cfg: TrainConfig | None = None
    parent: ParentModel | None = None
    init_weights: dict[str, torch.Tensor] | None = None
    replay_new_pairs: int | None = None  # with replay: the new pairs come first in train_split

    def trainer_options(self) -> dict[str, Any]:
        """``aiayn.train.Trainer``'s keyword arguments for the parent: none without one."""
        if self.parent is None:
            return {}
        assert self.train_cfg is not None
        replay = None if self.replay_new_pairs is None else (self.replay_new_pairs, self.train_cfg.finetune.replay_share)
        return {"init_weights": self.init_weights, "replay": replay}


def load_train_inputs(params: Params, layout: Layout, resolver: Resolver | None = None) -> TrainInputs:
    """Load the tokenizer's size and the encoded ``data.train_split`` / ``data.valid_split``; with
    ``train.init_from``, the parent the tokenize stage encoded them for (``aiayn.init_from.parent_for_training``;
    ``resolver`` downloads a registered one not kept yet), its weights and the replayed pairs.

    Raises ``FileNotFoundError`` if the tokenize stage has not run, ``aiayn.init_from.ParentModelError`` (one line)
    for a parent that cannot be loaded or continued.
    """
    spm_path = layout.tokenized / "spm.model"
    if not spm_path.exists():
        raise FileNotFoundError(f"{spm_path} not found: run the tokenize stage first")
    parent = parent_for_training(params.train, layout.root, layout.tokenized, resolver)
    tokenizer = Tokenizer.load(spm_path)
    model_cfg = params.model.model_copy(update={"vocab_size": tokenizer.vocab_size})
    train_split = load_encoded(layout.tokenized, params.data.train_split, vocab_size=tokenizer.vocab_size)
    valid_split = load_encoded(layout.tokenized, params.data.valid_split, vocab_size=tokenizer.vocab_size)
    inputs = TrainInputs(spm_path=spm_path, model_cfg=model_cfg, train_split=train_split, valid_split=valid_split,
                         data_id=data_id(layout, params.data.train_split), train_cfg=params.train)
    return inputs if parent is None else _continue(params, layout, inputs, parent)


def _continue(params: Params, layout: Layout, inputs: TrainInputs, parent: ParentModel) -> TrainInputs:
    """``inputs`` for continuing ``parent``: its architecture and weights, the fresh schedule, the replayed pairs."""
    check_architecture(params.model, parent)
    if sha256_file(inputs.spm_path) != parent.spm_sha256:
        raise ParentModelError(f"{inputs.spm_path} is not the parent's sentencepiece model: rerun the tokenize stage")
    model_cfg = training_model_config(params.model, parent)
    train_split, n_new, ident = inputs.train_split, None, f"{inputs.data_id},parent:{parent.weights_sha256[:16]}"
    if params.train.finetune.replay_share > 0:
        pool = load_encoded(layout.tokenized, REPLAY_SPLIT, vocab_size=model_cfg.vocab_size)
        train_split, n_new = join_splits(inputs.train_split, pool), len(inputs.train_split)
        ident += ",replay:" + ",".join(sha256_file(f)[:16] for f in encoded_files(layout.tokenized, REPLAY_SPLIT))
    return replace(inputs, model_cfg=model_cfg, train_split=train_split, data_id=ident,
                   train_cfg=finetune_train_config(params.train), parent=parent,
                   init_weights=parent_weights(parent, model_cfg), replay_new_pairs=n_new)


def parent_weights(parent: ParentModel, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The parent's weights, checked to fit ``model_cfg`` (names and shapes). Raises ``ParentModelError`` (one line)
    naming the file when they cannot be loaded or do not fit."""
    try:
        weights = load_model_weights(parent.weights)
    except CheckpointError as e:
        raise ParentModelError(f"train.init_from {parent.uri}: the parent's weights cannot be loaded: "
                               f"{' '.join(str(e).split())}") from None
    want = {k: tuple(v.shape) for k, v in Transformer(model_cfg, device="meta").state_dict().items()}
    have = {k: tuple(v.shape) for k, v in weights.items()}
    wrong = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
    if wrong:
        more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
        shown = "; ".join(f"{k}: {have.get(k, 'missing')} vs model {want.get(k, 'none')}" for k in wrong[:3])
        raise ParentModelError(f"train.init_from {parent.uri}: the parent's weights {parent.weights} do not fit its "
                               f"architecture: {shown}{more}")
    return weights


def job_summary(result: TrainResult, world_size: int) -> dict[str, Any]:
    """The JSON-able part of a rank's ``TrainResult`` (``RESULT_FILE``'s content)."""
    return {"step": result.step, "epoch": result.epoch, "stopped_by": result.stopped_by,
            "resumed_from": result.resumed_from, "train_seconds": result.train_seconds,
            "tokens": result.tokens, "skipped_updates": result.skipped_updates, "world_size": world_size}


def result_from_job(summary: dict[str, Any], model: Transformer) -> TrainResult:
    """``TrainResult`` back from a ``job_summary``, holding ``model`` (the ranks' weights stay in the checkpoints)."""
    return TrainResult(step=summary["step"], epoch=summary["epoch"], stopped_by=summary["stopped_by"],
                       resumed_from=summary["resumed_from"], train_seconds=summary["train_seconds"],
                       tokens=summary["tokens"], skipped_updates=summary["skipped_updates"], model=model)


def bleu_validator(params: Params, layout: Layout, inputs: TrainInputs):
    """The validation-BLEU scorer of ``params.train.valid_bleu`` (``aiayn.train.validation.BleuValidator``) over the
    prepared validation text, or None when it is off. Decodes with ``evaluate``'s length rules and the configured
    beam (``len_penalty``/``length_norm`` from ``evaluate`` when ``beam_size > 1``).

    Raises ``FileNotFoundError`` when the prepared validation split is missing.
    """
    vb, d, e = params.train.valid_bleu, params.data, params.evaluate
    if not vb.enabled:
        return None
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.evaluation.scoring import bleu_tokenizer
    from aiayn.train.validation import BleuValidator

    src, tgt = (layout.prepared / f"{d.valid_split}.{lang}" for lang in (d.src_lang, d.tgt_lang))
    for f in (src, tgt):
        if not f.exists():
            raise FileNotFoundError(f"{f} not found: validation BLEU needs the prepared validation split "
                                    "(run the prepare stage, or set train.valid_bleu.enabled: false)")
    options = DecodeOptions(beam_size=vb.beam_size, len_penalty=e.len_penalty, length_norm=e.length_norm,
                            max_len_a=e.max_len_a, max_len_b=e.max_len_b, max_tokens=e.max_tokens)
    return BleuValidator(Tokenizer.load(inputs.spm_path), read_lines(src), read_lines(tgt), options,
                         size=vb.sentences, seed=vb.seed, tokenize=bleu_tokenizer(d.tgt_lang, e.bleu_tokenize))
