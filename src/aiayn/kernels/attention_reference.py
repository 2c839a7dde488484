"""Plain PyTorch scaled dot-product attention: the reference the Triton kernel must agree with.

Scaled dot-product attention (Vaswani et al. 2017, Section 3.2.1, eq. 1)::

    Attention(Q, K, V) = softmax(Q K^T * sm_scale) V,   sm_scale = 1 / sqrt(head_dim)

computed the obvious way — the whole ``(Tq, Tk)`` score matrix in memory — in
float32 (float64 stays float64), so it is slow and memory-hungry but easy to
trust. Masking conventions are the same as ``aiayn.kernels.flash_attention``:

* ``key_lengths[b]`` keys are valid in batch row ``b`` (right padding);
* ``causal`` is aligned top-left: query ``i`` sees keys ``j <= i``;
* a query row that sees no key at all gets an all-zero output (and zero
  gradients), never NaN; its log-sum-exp is ``-inf``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention_reference", "attention_mask"]


def attention_mask(
    batch: int,
    q_len: int,
    k_len: int,
    *,
    causal: bool = False,
    key_lengths: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Boolean "may attend" mask, ``True`` where query ``i`` may see key ``j``.

    Returns a tensor broadcastable to ``(B, n_heads, Tq, Tk)`` — shape
    ``(B or 1, 1, Tq or 1, Tk)`` — or ``None`` when nothing is masked.
    """
    mask = None
    if key_lengths is not None:
        key_pos = torch.arange(k_len, device=device)
        mask = key_pos[None, :] < key_lengths.to(device=device, dtype=torch.long)[:, None]  # (B, Tk)
        mask = mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        q_pos = torch.arange(q_len, device=device)
        k_pos = torch.arange(k_len, device=device)
        tri = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk), top-left aligned
        tri = tri[None, None]  # (1, 1, Tq, Tk)
        mask = tri if mask is None else mask & tri  # (B, 1, Tq, Tk)
    return mask


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_lengths: torch.Tensor | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention by explicit matmul + softmax (differentiable).

    Args:
        q: ``(B, n_heads, Tq, head_dim)``.
        k, v: ``(B, n_heads, Tk, head_dim)``.
        causal: query ``i`` sees keys ``j <= i`` (top-left aligned).
        key_lengths: ``(B,)`` integer count of valid keys per batch row, or ``None``.
        sm_scale: score scale; default ``1 / sqrt(head_dim)``.
        return_lse: also return the log-sum-exp of the scaled, masked scores.

    Returns:
        ``out`` ``(B, n_heads, Tq, head_dim)`` in ``q.dtype``; with ``return_lse``
        also ``lse`` ``(B, n_heads, Tq)`` in the compute dtype (float32 or
        float64), ``-inf`` for rows that see no key.

    Raises:
        ValueError: ``q``/``k``/``v`` are not 4-D or their shapes disagree.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        shapes = f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        raise ValueError(f"q, k, v must be (B, n_heads, T, head_dim); got shapes {shapes}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible shapes q={tuple(q.shape)}, k={tuple(k.shape)}, v={tuple(v.shape)}")
    batch, _, q_len, head_dim = q.shape
    k_len = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32

    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale  # (B, n_heads, Tq, Tk)
    mask = attention_mask(batch, q_len, k_len, causal=causal, key_lengths=key_lengths, device=q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # Softmax with an explicit "no visible key" case: shift by the (detached)
    # row max, with 0 standing in for -inf so an empty row gives exp(-inf) = 0.
    row_max = scores.amax(dim=-1, keepdim=True).detach()  # (B, n_heads, Tq, 1)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)  # (B, n_heads, Tq, Tk); 0 where masked
    denom = weights.sum(dim=-1, keepdim=True)  # (B, n_heads, Tq, 1); 0 for an empty row
    probs = weights / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.matmul(probs, v.to(compute)).to(q.dtype)  # (B, n_heads, Tq, head_dim)
    if not return_lse:
        return out
    lse = (row_max + torch.log(denom)).squeeze(-1)  # (B, n_heads, Tq); log(0) = -inf for empty rows
    return out, lse
