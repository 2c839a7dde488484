"""Sinusoidal position encodings (Vaswani et al. 2017, Section 3.5).

    PE(pos, 2i)     = sin(pos / 10000 ** (2i / d_model))
    PE(pos, 2i + 1) = cos(pos / 10000 ** (2i / d_model))

Sine and cosine are *interleaved* along the feature axis exactly as the
paper's formula reads (fairseq/tensor2tensor concatenate the sine half and the
cosine half instead; the two differ only by a fixed permutation of features).
Positions count from 0 (the first input token, BOS on the target side).
The table is a derived, non-persistent buffer: it is not stored in
checkpoints and is recomputed at construction.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["sinusoid_table", "SinusoidalPositions"]


def sinusoid_table(n_positions: int, d_model: int) -> torch.Tensor:
    """Return the position-encoding table, shape ``(n_positions, d_model)``, float32.

    Computed in float64 and rounded once, so large positions stay accurate.
    Raises ``ValueError`` for a non-positive size.
    """
    if n_positions < 1 or d_model < 1:
        raise ValueError(f"sinusoid_table needs n_positions >= 1 and d_model >= 1, got {n_positions}, {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float64, device="cpu")[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")  # (ceil(d_model/2),)
    angle = pos * torch.exp(-math.log(10000.0) * two_i / d_model)  # (P, ceil(d_model/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64, device="cpu")
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings for positions ``0 .. max_positions - 1``."""

    def __init__(self, *, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        # The CPU table is moved to the module's (default) device; on 'meta' this is a no-op copy.
        table = sinusoid_table(max_positions, d_model).to(torch.get_default_device())
        self.register_buffer("table", table, persistent=False)  # (max_positions, d_model)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Encodings of positions ``start .. start + length - 1``: ``(length, d_model)``.

        Raises ``ValueError`` if the range leaves the table (``max_positions``).
        """
        if start < 0 or start + length > self.max_positions:
            raise ValueError(
                f"positions {start}..{start + length - 1} exceed max_positions={self.max_positions}; "
                "raise ModelConfig.max_positions or shorten the input"
            )
        return self.table[start : start + length]
