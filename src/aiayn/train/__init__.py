"""Training: label-smoothed loss, the paper's schedule, a ``Trainer`` with exact resume, early stopping, validated
checkpoint choice (averaging, best).

Pure core: tensors and files in, files out. Tracking and progress display arrive as
callbacks, so this package imports neither MLflow nor any orchestration library.
``train(...)`` is the one call the stages, the torchrun worker, the tests and the
benchmarks use; ``Trainer`` is the same run taken apart (``setup()``, then ``train()``
over ``step()`` / ``should_stop()`` / ``checkpoint()``).

Reproducibility contract (tests/test_train.py pins it, on CPU):

- ``seed`` seeds initialisation and dropout (reseeded per global batch,
  ``dropout_seed``); ``data_seed`` alone fixes the batch order
  (``aiayn.data.batching``). Two runs with the same seeds, data and config produce
  bitwise-identical weights.
- N data-parallel ranks (``train.distributed: ddp``) compute the same updates as
  one process with the same ``grad_accum`` (to fp32 summation order), and a
  checkpoint resumes on any world size.
- A checkpoint holds model, optimizer, every RNG state and the iterator
  position; a run stopped after any step (mid-epoch or at an epoch boundary)
  and resumed gives the same weights and per-step losses as an uninterrupted
  run.
"""

from __future__ import annotations

from aiayn.train.averaging import averaged_weights, on_grid
from aiayn.train.early_stop import EarlyStopper
from aiayn.train.loss import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy, validation_loss
from aiayn.train.schedule import dropout_seed, inverse_sqrt_lr, learning_rate, lr_schedule
from aiayn.train.select import Selection, select_weights
from aiayn.train.trainer import TrainResult, Trainer, config_fingerprint, train

__all__ = [
    "label_smoothed_cross_entropy",
    "linear_label_smoothed_cross_entropy",
    "inverse_sqrt_lr",
    "learning_rate",
    "lr_schedule",
    "TrainResult",
    "Trainer",
    "train",
    "config_fingerprint",
    "validation_loss",
    "averaged_weights",
    "on_grid",
    "dropout_seed",
    "EarlyStopper",
    "Selection",
    "select_weights",
]
