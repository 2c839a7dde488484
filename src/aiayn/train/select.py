"""Which weights become the model: a checkpoint or an average of several, chosen by ``train.select`` and VALIDATED.

Methods (``SelectConfig.method``):

- ``last``: the run's final state.
- ``average_last``: the element-wise mean of the last ``average_last`` *scheduled* checkpoints (the
  ``checkpoint_every`` grid, or epoch ends with ``epoch_checkpoints``: paper Section 6.1's evenly
  spaced checkpoints), leaving out any written inside the warmup (``step < warmup_steps``: weights
  still far from the optimum's basin; a run cut early would otherwise average them).
- ``best``: the checkpoint with the best validation ``metric``.
- ``average_best``: the mean of the ``average_last`` best checkpoints by ``metric``.

Validated choice: every checkpoint on disk (the trainer keeps the newest scheduled ones, the final
state and, for ``best``/``average_best``, the best validated ones) and the chosen weights are scored on
the validation split with ``metric``. When a single checkpoint scores better than the choice, the
selection says so, and with ``guard: keep_better`` takes that checkpoint instead. Every decision that
leaves something out (the warmup, a final state off the schedule, a method that could not apply)
is written down in ``Selection.notes``, which the train stage puts into ``model.json``,
``train_metrics.json`` and the tracker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import CheckpointError, average_checkpoints, checkpoint_step, list_checkpoints, load_checkpoint
from aiayn.config.schema import TrainConfig
from aiayn.train.early_stop import higher_is_better

__all__ = ["Selection", "checkpoint_extra", "plan", "select_weights"]

#: Scores weights on the validation split: ``{"valid_loss": ..., ...}`` (must hold ``select.metric``).
EvaluateFn = Callable[[dict[str, torch.Tensor]], dict[str, float]]


@dataclass
class Selection:
    """The chosen weights and why.

    ``steps``: the checkpoints averaged (one step for a single checkpoint); ``method``: the configured
    method; ``kind``: ``"average"`` or ``"single"``; ``value``: the chosen weights' ``metric``;
    ``candidates``: ``{step: metric}`` of every checkpoint scored; ``planned``: what the method alone
    chose (``{"steps", "value"}``); ``replaced``: the guard took a better single checkpoint; ``notes``:
    every decision, one sentence each.
    """

    weights: dict[str, torch.Tensor]
    steps: list[int]
    method: str
    metric: str
    kind: str
    value: float
    candidates: dict[int, float] = field(default_factory=dict)
    planned: dict[str, Any] = field(default_factory=dict)
    replaced: bool = False
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The JSON-able account (model.json ``selection``): everything but the weights, values rounded to 6 places."""
        return {"method": self.method, "metric": self.metric, "kind": self.kind, "steps": self.steps,
                "value": round(self.value, 6), "replaced": self.replaced,
                "planned": {"steps": self.planned.get("steps", []), "value": round(self.planned.get("value", 0.0), 6)},
                "candidates": {str(k): round(v, 6) for k, v in sorted(self.candidates.items())},
                "notes": list(self.notes)}

    def summary(self) -> str:
        """One line: what was chosen and its score."""
        what = f"average of steps {self.steps}" if self.kind == "average" else f"step {self.steps[0]}"
        return f"{what} ({self.metric} {self.value:.4f})" + (" [guard: replaced the planned average]" if self.replaced else "")


def checkpoint_extra(json_path: Path) -> dict[str, Any]:
    """The ``extra`` block of a checkpoint's JSON (validation history, scheduled steps, early stopping), without
    loading its tensors. Raises ``CheckpointError`` when the file cannot be read."""
    try:
        meta = json.loads(Path(json_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint metadata {json_path}: {e}") from e
    return dict(meta.get("extra") or {})


def plan(paths: list[Path], cfg: TrainConfig, scheduled: set[int], scores: dict[int, float]) -> tuple[list[Path], list[str]]:
    """The checkpoints ``cfg.select.method`` averages (one for a single checkpoint) and the notes on what it
    left out. ``paths``: the checkpoints on disk, oldest first; ``scheduled``: steps written on the
    schedule; ``scores``: ``{step: select.metric}`` (used by ``best``/``average_best``)."""
    sel, notes = cfg.select, []
    final = paths[-1]
    if sel.method == "last":
        return [final], notes
    if sel.method in ("best", "average_best"):
        k = 1 if sel.method == "best" else cfg.average_last
        sign = -1.0 if higher_is_better(sel.metric) else 1.0
        ranked = sorted((sign * scores[checkpoint_step(p)], checkpoint_step(p), p) for p in paths
                        if checkpoint_step(p) in scores)
        chosen = sorted((p for _, _, p in ranked[:k]), key=checkpoint_step)
        return chosen or [final], notes
    on_schedule = [p for p in paths if checkpoint_step(p) in scheduled]
    warm = [checkpoint_step(p) for p in on_schedule[-cfg.average_last:] if checkpoint_step(p) < cfg.warmup_steps]
    pool = [p for p in on_schedule if checkpoint_step(p) >= cfg.warmup_steps]
    chosen = pool[-cfg.average_last:]
    if warm:
        notes.append(f"checkpoints {warm} lie inside the warmup (< {cfg.warmup_steps} steps): not averaged")
    if not chosen:
        notes.append("no scheduled checkpoint after the warmup: the final state alone")
        return [final], notes
    if len(chosen) < cfg.average_last:
        notes.append(f"only {len(chosen)} of average_last={cfg.average_last} scheduled checkpoints available")
    if final not in chosen:
        notes.append(f"the final state (step {checkpoint_step(final)}) is not a scheduled checkpoint, so the "
                     "average leaves it out; it is scored as a candidate of the validated choice")
    return chosen, notes


def select_weights(checkpoint_dir: str | Path, cfg: TrainConfig, evaluate: EvaluateFn) -> Selection:
    """Choose the model's weights from the checkpoints in ``checkpoint_dir`` by ``cfg.select`` (module docstring).

    ``evaluate(weights)`` scores weights on the validation split (it must return ``cfg.select.metric``).
    Every checkpoint on disk is scored once, and the chosen average once more. Raises
    ``CheckpointError`` when there is no checkpoint (or one is corrupt), ``KeyError`` when ``evaluate``
    does not return the metric.
    """
    paths = list_checkpoints(checkpoint_dir)
    if not paths:
        raise CheckpointError(f"no checkpoints in {checkpoint_dir} to choose the model from")
    sel = cfg.select
    extra = checkpoint_extra(paths[-1])
    every = cfg.checkpoint_every
    scheduled = {int(s) for s in extra.get("scheduled_steps", [checkpoint_step(p) for p in paths
                                                               if checkpoint_step(p) % every == 0])}
    singles: dict[int, dict[str, torch.Tensor]] = {}
    scores: dict[int, float] = {}
    for p in paths:  # every candidate, scored the same way
        singles[checkpoint_step(p)] = load_checkpoint(p).model
        scores[checkpoint_step(p)] = float(evaluate(singles[checkpoint_step(p)])[sel.metric])
    chosen, notes = plan(paths, cfg, scheduled, scores)
    steps = [checkpoint_step(p) for p in chosen]
    if len(chosen) > 1:
        weights, kind = average_checkpoints(chosen), "average"
        value = float(evaluate(weights)[sel.metric])
    else:
        weights, kind, value = singles[steps[0]], "single", scores[steps[0]]
    selection = Selection(weights, steps, sel.method, sel.metric, kind, value, candidates=dict(scores),
                          planned={"steps": steps, "value": value}, notes=notes)
    _guard(selection, singles, sel.guard)
    return selection


def _guard(selection: Selection, singles: dict[int, dict[str, torch.Tensor]], guard: str) -> None:
    """Compare the choice with the best single checkpoint; note a better one and, with ``keep_better``, take it."""
    higher = higher_is_better(selection.metric)
    best_step = (max(selection.candidates, key=lambda s: (selection.candidates[s], s)) if higher  # ties: the latest
                 else min(selection.candidates, key=lambda s: (selection.candidates[s], -s)))
    best = selection.candidates[best_step]
    better = best > selection.value if higher else best < selection.value
    what = (f"the average of steps {selection.steps}" if selection.kind == "average"
            else f"step {selection.steps[0]}")
    if not better:
        selection.notes.append(f"validated: {what} scores {selection.metric} {selection.value:.4f}, no single "
                               f"checkpoint does better (best single: step {best_step}, {best:.4f})")
        return
    if guard == "keep_better":
        selection.notes.append(f"{what} scores {selection.metric} {selection.value:.4f}, worse than step "
                               f"{best_step}'s {best:.4f}: kept step {best_step} instead (select.guard: keep_better)")
        selection.weights, selection.steps, selection.kind = singles[best_step], [best_step], "single"
        selection.value, selection.replaced = best, True
    else:
        selection.notes.append(f"WARNING: {what} scores {selection.metric} {selection.value:.4f}, worse than step "
                               f"{best_step}'s {best:.4f}; kept it anyway (select.guard: warn)")
