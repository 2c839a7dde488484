"""Checkpoint averaging (paper Section 6.1) over the evenly spaced checkpoints of a run."""

from __future__ import annotations

from pathlib import Path

import torch

from aiayn.checkpoint import average_checkpoints, checkpoint_step, list_checkpoints

__all__ = ["on_grid", "averaged_weights"]


def on_grid(paths: list[Path], every: int) -> list[Path]:
    """The checkpoints among ``paths`` written on the ``every``-step grid (steps ``every, 2*every, ...``)."""
    return [p for p in paths if checkpoint_step(p) % every == 0]


def averaged_weights(checkpoint_dir: str | Path, last: int, *, every: int | None = None) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Average the model weights of the ``last`` newest evenly spaced checkpoints (paper Section 6.1).

    The paper averages checkpoints "written at 10-minute intervals": with ``every``
    (``train.checkpoint_every``) only checkpoints on that step grid are averaged, so a
    run that stopped off the grid (a signal, ``max_time_s``) averages e.g. steps
    1000..1800 rather than 1600, 1800, 1801. When no checkpoint is on the grid (a run
    shorter than ``every``), the newest one alone is used.

    Returns ``(weights, steps_averaged)``. Raises ``CheckpointError`` if there is none.
    """
    paths = list_checkpoints(checkpoint_dir)
    if every is not None:
        paths = on_grid(paths, every) or paths[-1:]
    paths = paths[-last:]
    steps = [checkpoint_step(p) for p in paths]
    return average_checkpoints(paths), steps
