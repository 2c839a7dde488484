"""Dropout whose CPU mask costs a quarter of torch's random draws.

Inverted dropout (Srivastava et al. 2014; the paper's residual and embedding dropout, Sec. 5.4): in
training every element is zeroed with probability ``p`` and the survivors are scaled by
``1 / (1 - p)``, so the expectation is unchanged; in eval it is the identity.

On CPU, ``torch.nn.Dropout`` draws one Bernoulli sample per element (``bernoulli_``); drawing a quarter
as many makes the main job's training step 1.06x faster (``benchmarks/perf/train_step_cost.py``,
docs/studies/job-sizing.md, "The CPU step's form"). Here one full-range 64-bit draw of torch's default
generator gives four 16-bit uniforms, each compared with a threshold: ``p`` is rounded to a multiple of
``1 / 65536`` (0.05 -> 3277 / 65536 = 0.050003) and the scale uses that rounded value, so the expectation
stays exact.
The mask is a function of the generator's state only (integer draws, no float arithmetic), so it is
the same bytes on every CPU, and a checkpoint's saved RNG state resumes it exactly. Other devices
keep ``torch.nn.functional.dropout`` (fused and cheap there), and so does code under ``torch.compile``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Resolution of the CPU mask's drop probability: ``p`` is rounded to a multiple of ``1 / QUANTUM``.
QUANTUM = 1 << 16


def quantized_p(p: float) -> float:
    """The drop probability the CPU mask applies for a requested ``p`` in ``[0, 1)``: ``round(p * 65536) / 65536``.

    Raises ``ValueError`` unless ``p == 0`` or ``round(p * 65536)`` is in 1 .. 65535 (a ``p`` below 2**-17
    would drop nothing, one within 2**-17 of 1 everything).
    """
    check_p(p)
    return round(p * QUANTUM) / QUANTUM


def check_p(p: float) -> None:
    """Raise ``ValueError`` for a drop probability the mask cannot apply (see :func:`quantized_p`)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if p > 0.0 and not 1 <= round(p * QUANTUM) <= QUANTUM - 1:
        raise ValueError(f"dropout probability {p} rounds to {round(p * QUANTUM)}/{QUANTUM} at the CPU mask's "
                         f"resolution: use 0, or a p in [2**-17, 1 - 2**-17)")


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, *, device: torch.device | str = "cpu",
              generator: torch.Generator | None = None) -> torch.Tensor:
    """A bool mask of ``shape``, each element False (dropped) with probability ``quantized_p(p)``.

    Draws ``ceil(numel / 4)`` int64 values from ``generator`` (torch's default when None), read as
    ``4 * that`` int16 uniforms on ``[-32768, 32767]``; an element is kept when its uniform is at least
    ``round(p * 65536) - 32768``. Raises ``ValueError`` for a ``p`` :func:`quantized_p` rejects.
    """
    check_p(p)
    n = 1
    for size in shape:
        n *= int(size)
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    draws.random_(-(1 << 63), None, generator=generator)  # the full 64-bit range: every bit uniform
    uniforms = draws.view(torch.int16)[:n].view(tuple(shape))
    return uniforms >= round(p * QUANTUM) - QUANTUM // 2


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout of ``x`` (any shape): the input itself outside training or at ``p == 0``; on CPU
    ``x * keep_mask * 1 / (1 - quantized_p(p))``; elsewhere, and under ``torch.compile`` (whose inductor draws
    its own masks), ``F.dropout``. Same shape and dtype as ``x``. Raises ``ValueError`` for a ``p``
    :func:`quantized_p` rejects."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p=p, training=True)
    noise = keep_mask(x.shape, p, device=x.device).to(x.dtype)
    return x * noise.mul_(1.0 / (1.0 - quantized_p(p)))


class Dropout(nn.Module):
    """``nn.Dropout``'s interface (``p``; ``train()`` / ``eval()``) over :func:`dropout`.

    Raises ``ValueError`` at construction for a ``p`` :func:`quantized_p` rejects.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        check_p(p)
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
