"""What the ``train`` stage and its torchrun ranks (``aiayn.stages.train_worker``) share.

Both read the same training inputs from the layout (the tokenizer sizes the model; the
data id enters the checkpoint fingerprint, so a one-process run and a torchrun job resume
each other), and they talk through one job folder: the launcher writes the resolved
params there, rank 0 appends its metrics and writes the run's result there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.config.schema import ModelConfig, Params
from aiayn.data.readers import read_lines
from aiayn.io import sha256_file
from aiayn.model import Transformer
from aiayn.stages import Layout
from aiayn.tokenizer import EncodedSplit, Tokenizer, encoded_files, load_encoded
from aiayn.train import TrainResult

__all__ = ["PARAMS_FILE", "METRICS_FILE", "RESULT_FILE", "TrainInputs", "load_train_inputs", "data_id",
           "job_summary", "result_from_job", "bleu_validator"]

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
    of the training split.
    """

    spm_path: Path
    model_cfg: ModelConfig
    train_split: EncodedSplit
    valid_split: EncodedSplit
    data_id: str


def load_train_inputs(params: Params, layout: Layout) -> TrainInputs:
    """Load the tokenizer's size and the encoded ``data.train_split`` / ``data.valid_split``.

    Raises ``FileNotFoundError`` if the tokenize stage has not run.
    """
    spm_path = layout.tokenized / "spm.model"
    if not spm_path.exists():
        raise FileNotFoundError(f"{spm_path} not found: run the tokenize stage first")
    tokenizer = Tokenizer.load(spm_path)
    model_cfg = params.model.model_copy(update={"vocab_size": tokenizer.vocab_size})
    train_split = load_encoded(layout.tokenized, params.data.train_split, vocab_size=tokenizer.vocab_size)
    valid_split = load_encoded(layout.tokenized, params.data.valid_split, vocab_size=tokenizer.vocab_size)
    return TrainInputs(spm_path=spm_path, model_cfg=model_cfg, train_split=train_split, valid_split=valid_split,
                       data_id=data_id(layout, params.data.train_split))


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
