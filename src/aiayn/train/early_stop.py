"""Early stopping on a validation metric, counted in validations (fairseq's ``--patience``).

A validation *improves* when its metric beats the best so far by more than ``min_delta`` (higher is
better for BLEU/chrF, lower for losses); after ``patience`` validations in a row without an
improvement the run stops. The state is three numbers, saved in every checkpoint, so a run killed
and resumed stops at the same step as one that never stopped; it depends only on the validation
metrics, which are deterministic functions of the weights (no RNG), so the same seeds give the same
stop step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["EarlyStopper", "higher_is_better"]


def higher_is_better(metric: str) -> bool:
    """True for scores (``valid_bleu``, ``valid_chrf``), False for losses (``valid_loss``, ``valid_nll``,
    ``valid_ppl``). Raises ``ValueError`` for another name."""
    if metric in ("valid_bleu", "valid_chrf"):
        return True
    if metric in ("valid_loss", "valid_nll", "valid_ppl"):
        return False
    raise ValueError(f"unknown validation metric {metric!r}: use valid_bleu, valid_chrf, valid_loss, valid_nll "
                     "or valid_ppl")


@dataclass
class EarlyStopper:
    """Patience counter over one validation metric.

    Args:
        metric: the key of the validation metrics to watch (``higher_is_better`` says the direction).
        patience: validations without an improvement before the run stops (>= 1).
        min_delta: how much (metric units: BLEU points, nats) the metric must beat the best by.

    ``best`` / ``best_step`` are the best value so far and the step it was measured at; ``bad`` the
    validations since then; ``stopped_at`` the step that exhausted the patience (None while running).
    """

    metric: str
    patience: int
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    bad: int = 0
    stopped_at: int | None = None

    def __post_init__(self) -> None:
        self.higher = higher_is_better(self.metric)
        if self.patience < 1:
            raise ValueError(f"early_stop.patience must be >= 1, got {self.patience}")
        if self.min_delta < 0:
            raise ValueError(f"early_stop.min_delta must be >= 0, got {self.min_delta}")

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (the first value always does)."""
        if self.best is None:
            return math.isfinite(value)
        return value > self.best + self.min_delta if self.higher else value < self.best - self.min_delta

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Take the validation of ``step``; returns True when the patience is now exhausted.

        Raises ``KeyError`` when ``metrics`` lacks the watched metric (e.g. ``valid_bleu`` with
        validation BLEU off).
        """
        if self.metric not in metrics:
            raise KeyError(f"early_stop.metric {self.metric!r} is not measured at validation "
                           f"(have {sorted(metrics)}); turn train.valid_bleu on or watch valid_loss")
        value = float(metrics[self.metric])
        if self.improves(value):
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
        if self.bad >= self.patience and self.stopped_at is None:
            self.stopped_at = step
        return self.stopped_at is not None

    @property
    def should_stop(self) -> bool:
        return self.stopped_at is not None

    def reason(self) -> str:
        """A one-line account of the stop (or of the state while running)."""
        best = "none" if self.best is None else f"{self.best:.4f} at step {self.best_step}"
        if self.stopped_at is None:
            return f"{self.metric}: best {best}, {self.bad}/{self.patience} validations without improvement"
        return (f"no {self.metric} improvement > {self.min_delta:g} for {self.patience} validations "
                f"(best {best}); stopped at step {self.stopped_at}")

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best": self.best, "best_step": self.best_step, "bad": self.bad,
                "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s values; a state for another metric is ignored (the config changed)."""
        if state.get("metric") != self.metric:
            return
        self.best = None if state.get("best") is None else float(state["best"])
        self.best_step = state.get("best_step")
        self.bad = int(state.get("bad", 0))
        self.stopped_at = state.get("stopped_at")
