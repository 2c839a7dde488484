"""One function per DVC stage: ``run(params, layout, recorder=NULL_RECORDER) -> summary``.

Each stage module exposes ``run(params: Params, layout: Layout, recorder: Recorder) -> dict`` that
reads its inputs from ``layout``, writes its outputs atomically under ``layout``, records what it
did into ``recorder`` (``aiayn.recording``: MLflow when ``aiayn <stage>`` or a Prefect flow starts it,
nothing by default) and returns a small JSON-able summary (counts, metrics, paths). The CLI
(``aiayn <stage>``), the Prefect flows (``pipelines/``) and ``dvc.yaml`` all call these same
functions; which stages make the pipeline, in which order, is the orchestrator's
(``pipelines.dag``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiayn.recording import DatasetRead

__all__ = ["Layout", "split_reads"]


@dataclass(frozen=True)
class Layout:
    """Where every stage reads and writes, relative to one project root.

    ``raw``       fetched Multi30k (``*.gz`` + SHA256SUMS), tracked by ``data.dvc``
    ``corpus``    the raw text of the configured source and pair (``aiayn.data.sources`` snapshot)
    ``prepared``  validated, NFC-normalised, filtered plain text: ``{split}.{lang}``
    ``tokenized`` ``spm.model``/``spm.vocab`` + encoded splits (numpy)
    ``model``     checkpoints, ``model.safetensors`` (the weights ``train.select`` chose), ``model.json``
    ``eval``      hypotheses ``{split}.hyp.{tgt_lang}`` and ``scores.json`` (with signatures)
    ``quantized`` one folder per quantized variant (``ct2-int8/``: model + ``variant.json``), reports
    ``export``    the serving bundle (``bundle.json``, model, ``spm.model``, model card), registered in MLflow
    ``*_metrics`` small JSON metrics files declared under DVC ``metrics:``
    """

    root: Path = Path(".")

    @property
    def raw(self) -> Path:
        return self.root / "data" / "multi30k"

    @property
    def corpus(self) -> Path:
        """Snapshot of the configured corpus source: raw files, ``SHA256SUMS``, ``SOURCE.json``."""
        return self.root / "artifacts" / "corpus"

    @property
    def prepare_report(self) -> Path:
        """What ``prepare`` read, kept and dropped per rule (DVC ``metrics``, outside the ``prepared`` out)."""
        return self.root / "artifacts" / "prepare_report.json"

    @property
    def prepared(self) -> Path:
        return self.root / "artifacts" / "prepared"

    @property
    def tokenized(self) -> Path:
        return self.root / "artifacts" / "tokenized"

    @property
    def model(self) -> Path:
        return self.root / "artifacts" / "model"

    @property
    def checkpoints(self) -> Path:
        """Step checkpoints; outside DVC outs (kept across stage reruns for resume)."""
        return self.root / "artifacts" / "checkpoints"

    @property
    def eval(self) -> Path:
        return self.root / "artifacts" / "eval"

    @property
    def train_metrics(self) -> Path:
        """Validation metrics of the chosen model (``train.select``; DVC ``metrics``, outside the ``model`` out)."""
        return self.root / "artifacts" / "train_metrics.json"

    @property
    def parent_model(self) -> Path:
        """The parent a continued training started from (``train.init_from``: URI, version, sha256 of its weights;
        ``{"init_from": null}`` from scratch): a train stage output, so ``dvc.lock`` records which parent was used."""
        return self.root / "artifacts" / "parent_model.json"

    @property
    def plots(self) -> Path:
        """Per-step curves and per-test-set scores for ``dvc plots`` (each file a stage's ``plots`` output)."""
        return self.root / "artifacts" / "plots"

    @property
    def eval_metrics(self) -> Path:
        """``{split: {bleu, chrf, bleu_lc_tok}}`` (DVC ``metrics``, outside the ``eval`` out)."""
        return self.root / "artifacts" / "eval_metrics.json"

    @property
    def quantized(self) -> Path:
        """Quantized variants ``{variant}/`` (each with ``variant.json``), ``report.json``, ``outliers/``."""
        return self.root / "artifacts" / "quantized"

    @property
    def quantize_metrics(self) -> Path:
        """Per-variant BLEU/chrF, deltas, bytes, status (DVC stage ``metrics``, outside ``quantized``;
        deterministic bytes, so ``dvc.lock`` hashes repeat run to run)."""
        return self.root / "artifacts" / "quantize_metrics.json"

    @property
    def export(self) -> Path:
        """The serving bundle (``aiayn.export.bundle``): model, tokenizer, ``bundle.json``, model card."""
        return self.root / "artifacts" / "export"

    @property
    def quantize_throughput(self) -> Path:
        """Wall-clock decode throughput and stage seconds: a top-level ``metrics:`` file in ``dvc.yaml``
        (``dvc metrics show`` lists it) that no stage declares as an output, so its run-to-run noise
        never enters ``dvc.lock``."""
        return self.root / "artifacts" / "quantize_throughput.json"


def split_reads(layout: Layout, splits: Iterable[str], langs: Iterable[str], context: str) -> tuple[DatasetRead, ...]:
    """The prepared files ``{split}.{lang}`` a stage reads, as ``DatasetRead`` s of ``context`` (split by
    split, languages in the given order; paths relative to ``layout.root``)."""
    langs = tuple(langs)
    return tuple(DatasetRead((layout.prepared / f"{split}.{lang}").relative_to(layout.root).as_posix(), context)
                 for split in splits for lang in langs)
