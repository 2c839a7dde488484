"""Position information: the paper's sinusoids and the variants ``ModelConfig.positions`` offers.

- ``sinusoidal`` (the paper, ``SinusoidalPositions``), added to the embeddings.
- ``learned`` (``LearnedPositions``): a trained table, added to the embeddings (Gehring et al. 2017,
  "Convolutional Sequence to Sequence Learning", Sec. 3.1; the paper's Table 3 row (E)).
- ``rope`` (``RotaryPositions``): queries and keys of self-attention rotated by their absolute
  position, so their dot product depends on the offset only (Su et al. 2021, "RoFormer", Sec. 3.4,
  eq. 34; pairs ``(x_2i, x_2i+1)`` rotated by ``pos * base ** (-2i / head_dim)``).
- ``alibi`` (``alibi_slopes``, ``alibi_bias``): no position embedding; self-attention scores get
  ``-slope_h * |i - j|`` (Press et al. 2022, "Train Short, Test Long", Sec. 3; the absolute distance
  for the bidirectional encoder; in the causal decoder only ``j <= i`` is visible, where it equals the
  paper's ``-slope_h * (i - j)``). Cross-attention gets none (source and target positions do not align).

Every variant also takes per-row positions ``(B, T)`` (``SinusoidalPositions.at``, ``LearnedPositions.at``,
``RotaryPositions.rotate(x, positions)``, ``alibi_bias`` with 2-D positions): the decoder-only stream
(``ModelConfig.arch='decoder_only'``) left-pads each source inside the model and numbers each row's
tokens from its first real token, so a sentence's positions do not depend on its batch's padding.

Sinusoidal encodings (Vaswani et al. 2017, Section 3.5):

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

__all__ = [
    "check_range", "sinusoid_table", "SinusoidalPositions", "LearnedPositions", "additive_positions", "RotaryPositions",
    "alibi_slopes", "alibi_bias",
]  # fmt: skip


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
        check_range(start, length, self.max_positions)
        return self.table[start : start + length]

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """Encodings of per-row positions ``(B, T)`` (long, each in ``0 .. max_positions - 1``, checked
        by the caller): ``(B, T, d_model)``. The decoder-only stream gives every row its own offsets."""
        return self.table[positions]


def check_range(start: int, length: int, max_positions: int) -> None:
    """Raise ``ValueError`` unless positions ``start .. start + length - 1`` lie in ``0 .. max_positions - 1``.

    The one owner of the position limit: the tables, the rotary tables and ``Transformer`` (for every
    ``positions`` variant, ALiBi included, which has no table) all call it.
    """
    if start < 0 or start + length > max_positions:
        raise ValueError(
            f"positions {start}..{start + length - 1} exceed max_positions={max_positions}; "
            "raise ModelConfig.max_positions or shorten the input"
        )


class LearnedPositions(nn.Module):
    """A trained position table ``(max_positions, d_model)``, added to the embeddings; initialised
    ~ Normal(0, d_model**-0.5) (fairseq's ``LearnedPositionalEmbedding``). Same call as
    ``SinusoidalPositions``; ``table`` is a parameter (saved in checkpoints)."""

    def __init__(self, *, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Parameter(torch.empty(max_positions, d_model))  # (max_positions, d_model)
        if not self.table.is_meta:
            nn.init.normal_(self.table, mean=0.0, std=d_model**-0.5)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Rows ``start .. start + length - 1``: ``(length, d_model)``. ``ValueError`` beyond the table."""
        check_range(start, length, self.max_positions)
        return self.table[start : start + length]

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """Rows of per-row positions ``(B, T)`` (long, checked by the caller): ``(B, T, d_model)``."""
        return self.table[positions]


def additive_positions(kind: str, *, max_positions: int, d_model: int) -> SinusoidalPositions | LearnedPositions | None:
    """The position table added to the embeddings for ``ModelConfig.positions`` = ``kind``: a
    ``SinusoidalPositions`` or ``LearnedPositions`` module, or ``None`` for ``rope`` / ``alibi`` (their
    positions act inside self-attention). Raises ``ValueError`` for an unknown kind."""
    if kind == "sinusoidal":
        return SinusoidalPositions(max_positions=max_positions, d_model=d_model)
    if kind == "learned":
        return LearnedPositions(max_positions=max_positions, d_model=d_model)
    if kind in ("rope", "alibi"):
        return None
    raise ValueError(f"unknown positions {kind!r}; choose 'sinusoidal', 'learned', 'rope' or 'alibi'")


class RotaryPositions(nn.Module):
    """Rotary position embedding (RoFormer, Su et al. 2021, eq. 34) for ``head_dim``-wide heads.

    ``rotate(x, start)``: ``x`` ``(B, H, T, head_dim)`` at positions ``start .. start + T - 1`` ->
    same shape; feature pair ``(2i, 2i + 1)`` turned by angle ``pos * base ** (-2i / head_dim)``.
    Tables ``(max_positions, head_dim / 2)`` are derived, non-persistent buffers (float64, rounded once).
    Raises ``ValueError`` for an odd ``head_dim`` or positions beyond ``max_positions``.
    """

    def __init__(self, *, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        self.max_positions = max_positions
        pos = torch.arange(max_positions, dtype=torch.float64, device="cpu")[:, None]  # (P, 1)
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)  # (D/2,)
        angle = pos * inv_freq  # (P, D/2)
        device = torch.get_default_device()
        self.register_buffer("cos", torch.cos(angle).float().to(device), persistent=False)  # (P, D/2)
        self.register_buffer("sin", torch.sin(angle).float().to(device), persistent=False)  # (P, D/2)

    def rotate(self, x: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """``start``: an int (positions ``start ..``, shared by every row) or per-row positions
        ``(B, T)`` long (the decoder-only stream; range checked by the caller).

        float32 / float64: each pair is one complex number times ``cos + i sin`` (one complex multiply,
        ~4 % of the main job's CPU step cheaper than the real form below, measured in
        ``benchmarks/perf/train_step_cost.py``; the same products and sums, hence the same bytes wherever the
        vector kernels cover the row: every head_dim that is a multiple of 16). Other dtypes (no complex
        type), a layout ``view_as_complex`` cannot take, and code under ``torch.compile`` (inductor generates
        no complex code):
        ``(even cos - odd sin, even sin + odd cos)``."""
        if isinstance(start, torch.Tensor):
            cos, sin = self.cos[start][:, None], self.sin[start][:, None]  # (B, 1, T, D/2)
        else:
            T = x.shape[-2]
            check_range(start, T, self.max_positions)
            cos, sin = self.cos[start : start + T], self.sin[start : start + T]  # (T, D/2)
        if x.dtype in (torch.float32, torch.float64) and _pairs_as_complex(x) and not torch.compiler.is_compiling():
            turn = torch.complex(cos, sin).to(torch.complex128 if x.dtype == torch.float64 else torch.complex64)
            pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # (B, H, T, D/2) complex
            return torch.view_as_real(pairs * turn).flatten(-2)  # (B, H, T, D)
        return rotate_pairs(x, cos.to(x.dtype), sin.to(x.dtype))


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoFormer eq. 34 in its real form: feature pair ``(2i, 2i + 1)`` of ``x`` ``(..., T, D)`` ->
    ``(even cos - odd sin, even sin + odd cos)``, with ``cos``/``sin`` ``(T, D/2)`` (or broadcastable) in
    ``x``'s dtype. Same shape as ``x``."""
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)  # (..., T, D)


def _pairs_as_complex(x: torch.Tensor) -> bool:
    """Whether ``x``'s feature pairs can be viewed as complex numbers in place (``torch.view_as_complex``):
    unit stride in the last dim, every other stride and the storage offset even."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes ``(n_heads,)`` of Press et al. 2022, Sec. 3: the geometric sequence starting at
    ``2 ** (-8 / n)`` with that ratio for ``n`` a power of two; otherwise the slopes of the nearest
    lower power of two followed by every other slope of the next one (their reference code)."""
    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if n_heads < 1:
        raise ValueError(f"alibi needs n_heads >= 1, got {n_heads}")
    if math.log2(n_heads).is_integer():
        slopes = power_of_2(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_2(closest) + alibi_slopes(2 * closest).tolist()[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32, device="cpu")


def alibi_bias(slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """Additive score bias ``-slope_h * |q_pos - k_pos|``: ``(1, n_heads, Tq, Tk)`` from ``slopes``
    ``(n_heads,)`` and positions ``(Tq,)``, ``(Tk,)`` (depends on the offset only); per-row positions
    ``(B, Tq)``, ``(B, Tk)`` (the decoder-only stream) give ``(B, n_heads, Tq, Tk)``."""
    if q_positions.dim() == 2:
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().to(slopes.dtype)  # (B, Tq, Tk)
        return -slopes[None, :, None, None] * dist[:, None]  # (B, n_heads, Tq, Tk)
    dist = (q_positions[:, None] - k_positions[None, :]).abs().to(slopes.dtype)  # (Tq, Tk)
    return (-slopes[:, None, None] * dist)[None]  # (1, n_heads, Tq, Tk)
