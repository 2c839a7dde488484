"""One function per DVC stage: ``run(params, layout) -> summary``.

Each stage module exposes ``run(params: Params, layout: Layout) -> dict`` that
reads its inputs from ``layout``, writes its outputs atomically under
``layout``, and returns a small JSON-able summary (counts, metrics, paths).
The CLI (``aiayn <stage>``), the Prefect flows (``pipelines/``) and
``dvc.yaml`` all call these same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Layout", "STAGES"]

#: Pipeline order (DVC DAG).
STAGES = ("prepare", "tokenize", "train", "evaluate", "quantize")


@dataclass(frozen=True)
class Layout:
    """Where every stage reads and writes, relative to one project root.

    ``raw``       fetched corpus (``*.gz`` + SHA256SUMS), tracked by ``data.dvc``
    ``prepared``  validated, NFC-normalised, filtered plain text: ``{split}.{lang}``
    ``tokenized`` ``spm.model``/``spm.vocab`` + encoded splits (numpy)
    ``model``     checkpoints, ``model.safetensors`` (averaged), ``model.json``
    ``eval``      hypotheses ``{split}.hyp.{tgt_lang}`` and ``scores.json`` (with signatures)
    ``quantized`` one folder per quantized variant (``ct2-int8/``: model + ``variant.json``), reports
    ``*_metrics`` small JSON metrics files declared under DVC ``metrics:``
    """

    root: Path = Path(".")

    @property
    def raw(self) -> Path:
        return self.root / "data" / "multi30k"

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
        """Validation metrics of the averaged model (DVC ``metrics``, outside the ``model`` out)."""
        return self.root / "artifacts" / "train_metrics.json"

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
        """Per-variant BLEU/chrF, deltas, bytes, status, throughput (DVC ``metrics``, outside ``quantized``)."""
        return self.root / "artifacts" / "quantize_metrics.json"
