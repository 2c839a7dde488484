"""What each optimizer update uses that depends on its number alone: the learning rate and the dropout seeds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from aiayn.config.schema import TrainConfig

__all__ = ["inverse_sqrt_lr", "learning_rate", "lr_schedule", "finetune_train_config", "dropout_seed"]


def inverse_sqrt_lr(step: int, *, d_model: int, warmup_steps: int, lr_scale: float = 1.0) -> float:
    """Learning rate at optimizer step ``step`` (1-based), paper Section 5.3, eq. (3).

    ``lr = lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``
    """
    step = max(step, 1)
    return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def learning_rate(
    step: int, *, d_model: int, warmup_steps: int, lr_scale: float = 1.0, decay: str = "inverse_sqrt", max_steps: int = 0
) -> float:
    """Learning rate at optimizer step ``step`` (1-based) under schedule ``decay``.

    ``inverse_sqrt``: the paper's eq. (3) (``inverse_sqrt_lr``). ``linear``: the same warmup to the same
    peak ``lr_scale * d_model**-0.5 * warmup_steps**-0.5``, then a straight line to 0 after step
    ``max_steps`` (the warmup + linear-decay schedule of BERT, Devlin et al. 2019, Section A.2; a short
    budget ends annealed instead of at 1/sqrt of the peak). Raises ``ValueError`` for an unknown ``decay``
    or a ``linear`` schedule whose ``max_steps`` is not past ``warmup_steps``.
    """
    if decay == "inverse_sqrt":
        return inverse_sqrt_lr(step, d_model=d_model, warmup_steps=warmup_steps, lr_scale=lr_scale)
    if decay != "linear":
        raise ValueError(f"unknown lr decay {decay!r}: inverse_sqrt | linear")
    if max_steps <= warmup_steps:
        raise ValueError(f"a linear lr decay needs max_steps ({max_steps}) > warmup_steps ({warmup_steps})")
    step = max(step, 1)
    peak = lr_scale * d_model**-0.5 * warmup_steps**-0.5
    if step <= warmup_steps:
        return peak * step / warmup_steps
    return peak * max(0, max_steps + 1 - step) / (max_steps + 1 - warmup_steps)


def lr_schedule(cfg: TrainConfig, d_model: int) -> Callable[[int], float]:
    """``step -> learning rate`` of a run with train config ``cfg`` and model width ``d_model``: the one
    schedule the optimizer follows and every record of it (progress, MLflow, ``plots/train_loss.tsv``)
    reports (``learning_rate`` with ``cfg``'s ``warmup_steps``, ``lr_scale``, ``lr_decay``, ``max_steps``)."""

    def lr(step: int) -> float:
        return learning_rate(step, d_model=d_model, warmup_steps=cfg.warmup_steps, lr_scale=cfg.lr_scale,
                             decay=cfg.lr_decay, max_steps=cfg.max_steps)

    return lr


def finetune_train_config(cfg: TrainConfig) -> TrainConfig:
    """The train config a run follows: ``cfg`` itself without ``init_from``; with it, a fresh schedule
    (``cfg.finetune``): warmup over ``finetune.warmup_steps`` to ``finetune.lr_scale`` times the peak of ``cfg``'s
    own schedule, then ``cfg.lr_decay``.

    The peak of ``learning_rate`` is ``lr_scale * d_model**-0.5 * warmup_steps**-0.5`` (either decay), so the
    returned config's ``lr_scale`` is ``cfg.lr_scale * finetune.lr_scale * sqrt(finetune.warmup_steps /
    cfg.warmup_steps)``: a shorter warmup does not raise the peak. Everything else is ``cfg``'s.
    """
    if cfg.init_from is None:
        return cfg
    ft = cfg.finetune
    scale = cfg.lr_scale * ft.lr_scale * (ft.warmup_steps / cfg.warmup_steps) ** 0.5
    return cfg.model_copy(update={"warmup_steps": ft.warmup_steps, "lr_scale": scale})


def dropout_seed(seed: int, step: int, batch: int) -> int:
    """The RNG seed of global batch ``batch`` (0-based) of optimizer update ``step`` (1-based).

    Dropout masks are drawn from ``torch.manual_seed(dropout_seed(...))`` set before each
    batch's forward pass, so they are a pure function of ``(seed, step, batch)``: the same on
    any rank and any world size (fairseq reseeds per update for the same reason). Returns an
    int in ``[0, 2**63)``.
    """
    words = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, int(step), int(batch)]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
