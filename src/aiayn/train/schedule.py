"""What each optimizer update uses that depends on its number alone: the learning rate and the dropout seeds."""

from __future__ import annotations

import numpy as np

__all__ = ["inverse_sqrt_lr", "dropout_seed"]


def inverse_sqrt_lr(step: int, *, d_model: int, warmup_steps: int, lr_scale: float = 1.0) -> float:
    """Learning rate at optimizer step ``step`` (1-based), paper Section 5.3, eq. (3).

    ``lr = lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``
    """
    step = max(step, 1)
    return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def dropout_seed(seed: int, step: int, batch: int) -> int:
    """The RNG seed of global batch ``batch`` (0-based) of optimizer update ``step`` (1-based).

    Dropout masks are drawn from ``torch.manual_seed(dropout_seed(...))`` set before each
    batch's forward pass, so they are a pure function of ``(seed, step, batch)``: the same on
    any rank and any world size (fairseq reseeds per update for the same reason). Returns an
    int in ``[0, 2**63)``.
    """
    words = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, int(step), int(batch)]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
