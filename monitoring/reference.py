"""The ``monitor_reference`` stage: the training distribution the drift monitor compares against.

``run(params, layout)`` reads the training split's source side (``artifacts/prepared``), the
tokenizer and encoded splits (``artifacts/tokenized``) and the trained model
(``artifacts/model``), and writes ``artifacts/monitor_reference/``:

- ``reference.safetensors``: ``desc.<name>`` ``(n,)`` float64 for every descriptor of
  ``monitoring.descriptors.DESCRIPTORS``; ``embeddings`` ``(n, embedding_dims)`` float32 (the
  mean-pooled encoder output, PCA-reduced); ``pca.mean`` ``(d_model,)`` and ``pca.components``
  ``(embedding_dims, d_model)``; ``source_side`` ``(vocab_size,)`` uint8 (the piece table behind
  ``src_lang_score``).
- ``reference.json``: what it was built from (model and tokenizer SHA-256, split, languages,
  sentence count, the ``monitor`` params that shape it), the PCA's explained variance and each
  descriptor's mean, standard deviation and quantiles (a reviewer's view of "normal").
- ``output_reference.json``: the serving bundle's answers to the validation split described by
  their output signals, and each signal's calibrated threshold (``monitoring.output_check``).

Deterministic: the same inputs give the same bytes (seeded sample, full-SVD PCA, safetensors), so
``dvc.lock`` repeats. Written atomically (the folder is swapped in whole). In ``dvc.yaml`` it runs
after ``export``, as the last stage: the reference belongs to the model that ships, and its run ends
the pipeline run (``RECORD``).

Errors: ``FileNotFoundError`` for a missing input (naming the stage that makes it),
``ValueError`` for an empty training split or more PCA components than the data allows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.config.schema import Params
from aiayn.faults import fault_point
from aiayn.io import atomic_dir, atomic_write_json, sha256_file
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.stages import Layout
from monitoring.descriptors import DESCRIPTORS, Pca, describe, encoder_embeddings, source_side_table
from monitoring.output_check import OUTPUT_REFERENCE, build_output_reference

__all__ = ["run", "FILES", "REFERENCE_PARAMS", "RECORD", "reference_dir"]

log = logging.getLogger("aiayn.monitor")

#: Files of the reference folder.
FILES = ("reference.safetensors", "reference.json", OUTPUT_REFERENCE)
#: ``monitor`` params that change the reference (``dvc.yaml`` lists them); the rest shape the check.
REFERENCE_PARAMS = ("reference_sentences", "reference_seed", "embedding_dims", "output_false_flag_rate")
#: How a monitor_reference run is recorded: the pipeline's last stage, so its end ends the pipeline run.
RECORD = StageRecord("monitor_reference", ends_pipeline=True)


def reference_dir(layout: Layout) -> Path:
    """``artifacts/monitor_reference`` under the project root."""
    return layout.root / "artifacts" / "monitor_reference"


def _require(path: Path, made_by: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the {made_by} stage first (`dvc repro {made_by}`)")
    return path


def _summary(values: np.ndarray) -> dict[str, float]:
    q = np.quantile(values, [0.05, 0.5, 0.95])
    return {"mean": round(float(values.mean()), 6), "std": round(float(values.std()), 6),
            "p05": round(float(q[0]), 6), "p50": round(float(q[1]), 6), "p95": round(float(q[2]), 6)}


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Build the drift reference (module doc), record its params and size into ``recorder``; return a
    small summary (sentences, dims, seconds)."""
    import time

    import torch
    from safetensors.numpy import save_file

    from aiayn.data.readers import read_lines
    from aiayn.tokenizer import load_encoded
    from aiayn.inference.translator import Translator

    t0 = time.perf_counter()
    m, d = params.monitor, params.data
    src_path = _require(layout.prepared / f"{d.train_split}.{d.src_lang}", "prepare")
    _require(layout.tokenized / "spm.model", "tokenize")
    weights = _require(layout.model / "model.safetensors", "train")
    sentences = read_lines(src_path)
    if not sentences:
        raise ValueError(f"{src_path} holds no sentences: nothing to describe")
    if m.reference_sentences is not None and m.reference_sentences < len(sentences):
        rng = np.random.default_rng(m.reference_seed)
        keep = np.sort(rng.choice(len(sentences), size=m.reference_sentences, replace=False))
        sentences = [sentences[i] for i in keep]

    translator = Translator.from_dir(layout.model, device="cpu")
    tokenizer = translator.tokenizer
    train = load_encoded(layout.tokenized, d.train_split, vocab_size=tokenizer.vocab_size)
    side = source_side_table(train.src_ids, train.tgt_ids, tokenizer.vocab_size)
    desc = describe(sentences, tokenizer, side)
    torch.manual_seed(0)  # the encoder is in eval mode (no dropout); belt and braces
    emb = encoder_embeddings(translator, sentences)
    pca = Pca.fit(emb, m.embedding_dims)
    reduced = pca.transform(emb)
    explained = float(((emb - pca.mean) @ pca.components.T).var(0).sum() / emb.var(0).sum())

    meta = {
        "sentences": len(sentences),
        "split": d.train_split,
        "src_lang": d.src_lang,
        "descriptors": list(DESCRIPTORS),
        "descriptor_summary": {k: _summary(v) for k, v in desc.items()},
        "embedding_dims": m.embedding_dims,
        "d_model": int(emb.shape[1]),
        "pca_explained_variance": round(explained, 6),
        "model_sha256": sha256_file(weights),
        "tokenizer_sha256": sha256_file(layout.model / "spm.model"),
        "params": {k: getattr(m, k) for k in REFERENCE_PARAMS},
    }
    tensors = {f"desc.{k}": np.ascontiguousarray(v) for k, v in desc.items()}
    tensors |= {"embeddings": np.ascontiguousarray(reduced), "pca.mean": pca.mean,
                "pca.components": np.ascontiguousarray(pca.components), "source_side": side.astype(np.uint8)}
    outputs = build_output_reference(params, layout)
    with atomic_dir(reference_dir(layout)) as tmp:
        # ONE metadata key: safetensors writes several in a random (hash map) order, and the file's
        # bytes would change from run to run (dvc.lock with them)
        save_file(tensors, str(tmp / "reference.safetensors"), metadata={"format": "aiayn-drift-reference/1"})
        fault_point("monitor_reference.tensors_written")
        atomic_write_json(tmp / "reference.json", meta)
        atomic_write_json(tmp / OUTPUT_REFERENCE, outputs)
    seconds = time.perf_counter() - t0
    log.info("drift reference: %d sentences, %d descriptors, %d-dim embeddings (PCA keeps %.1f %% of the "
             "variance) in %.1f s", len(sentences), len(DESCRIPTORS), m.embedding_dims, 100 * explained, seconds)
    with recorder.start(RECORD) as tracker:
        tracker.log_params({f"monitor.{k}": getattr(m, k) for k in REFERENCE_PARAMS})
        tracker.log_metrics({"reference.sentences": len(sentences), "reference.pca_explained_variance": explained},
                            step=0)
        tracker.log_artifact(reference_dir(layout) / "reference.json", artifact_path="monitor_reference")
        tracker.log_artifact(reference_dir(layout) / OUTPUT_REFERENCE, artifact_path="monitor_reference")
        tracker.log_metrics({f"output_threshold.{name}.{side}": t[side] for name, t in outputs["thresholds"].items()
                             for side in ("low", "high") if side in t}, step=0)
    return {"sentences": len(sentences), "embedding_dims": m.embedding_dims,
            "pca_explained_variance": round(explained, 4), "seconds": round(seconds, 1)}
