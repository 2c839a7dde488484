"""Scaled dot-product attention backends behind one signature (paper Section 3.2.1, eq. 1).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(head_dim)) V

Every backend is a function::

    attend(q, k, v, *, causal, key_padding_mask, dropout_p, bias=None) -> (B, n_heads, Tq, head_dim)

    q                 (B, n_heads, Tq, head_dim)
    k, v              (B, n_kv_heads, Tk, head_dim); n_heads % n_kv_heads == 0. Query head h
                      reads key/value head h // (n_heads // n_kv_heads) (grouped-query attention,
                      Ainslie et al. 2023; n_kv_heads == 1 is multi-query attention).
    causal            query i may see key j only if j <= i + (Tk - Tq), i.e. the mask is aligned
                      bottom-right: the usual lower triangle when Tq == Tk, and "see every cached
                      key" for one new query after a KV cache (Tq == 1).
    key_padding_mask  (B, Tk) bool, True = padding (key ignored), or None.
    dropout_p         dropout on the attention probabilities; callers pass 0.0 outside training.
    bias              additive score bias (B or 1, n_heads, Tq, Tk) float (ALiBi), or None. The
                      ``triton`` backend has none (raises): the model then uses ``sdpa``.

A query row whose keys are all masked returns zeros (never NaN) in every backend.

Backends:
- ``reference``: plain matmul + softmax with float32 accumulation; the readable ground truth.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels when the mask allows).
- ``triton``: the project's flash-attention kernel (``aiayn.kernels.flash_attention``), imported
  lazily. It takes right padding as per-row key lengths and has no dropout.

``select_backend`` picks one once, at model construction, and logs the choice.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["AttendFn", "BACKENDS", "attend_reference", "attend_sdpa", "attend_triton", "select_backend", "repeat_kv"]

logger = logging.getLogger("aiayn")

AttendFn = Callable[..., torch.Tensor]


def repeat_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Expand ``(B, n_kv_heads, T, head_dim)`` to ``(B, n_heads, T, head_dim)`` for grouped-query attention.

    Query head ``h`` gets key/value head ``h // (n_heads // n_kv_heads)``. Raises ``ValueError`` when
    ``n_heads`` is not a multiple of ``n_kv_heads``.
    """
    B, n_kv_heads, T, head_dim = k.shape
    if n_heads == n_kv_heads:
        return k
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    rep = n_heads // n_kv_heads
    k = k[:, :, None].expand(B, n_kv_heads, rep, T, head_dim)  # (B, n_kv_heads, rep, T, head_dim)
    return k.reshape(B, n_heads, T, head_dim)  # (B, n_heads, T, head_dim)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"attend expects q (B, n_heads, Tq, head_dim) and k == v (B, n_kv_heads, Tk, head_dim); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim")
    if key_padding_mask is not None and (
        key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (k.shape[0], k.shape[2])
    ):
        raise ValueError(
            f"key_padding_mask must be bool (B, Tk) = {(k.shape[0], k.shape[2])}, "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


def _allowed_mask(
    B: int, Tq: int, Tk: int, *, causal: bool, key_padding_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """Boolean mask, True = query may attend to key: ``(B or 1, 1, Tq, Tk)``, or None when nothing is masked."""
    allowed = None
    if causal:
        i = torch.arange(Tq, device=device)[:, None]  # (Tq, 1)
        j = torch.arange(Tk, device=device)[None, :]  # (1, Tk)
        allowed = (j <= i + (Tk - Tq))[None, None]  # (1, 1, Tq, Tk), bottom-right aligned
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
        allowed = keep if allowed is None else allowed & keep  # (B, 1, Tq, Tk)
    return allowed


def attend_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain PyTorch attention (eq. 1) in float32 (float64 stays float64); returns ``(B, n_heads, Tq, head_dim)``.

    Masked scores get the most negative finite float rather than -inf, so a fully masked row
    gives a finite uniform softmax (and finite gradients); that row is then zeroed.
    """
    _check_shapes(q, k, v, key_padding_mask)
    B, n_heads, Tq, head_dim = q.shape
    Tk = k.shape[2]
    acc = torch.promote_types(q.dtype, torch.float32)
    k = repeat_kv(k, n_heads).to(acc)  # (B, n_heads, Tk, head_dim)
    v = repeat_kv(v, n_heads).to(acc)  # (B, n_heads, Tk, head_dim)
    scores = q.to(acc) @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (B, n_heads, Tq, Tk)
    if bias is not None:
        scores = scores + bias.to(acc)
    allowed = _allowed_mask(B, Tq, Tk, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(acc).min)
    probs = torch.softmax(scores, dim=-1)  # (B, n_heads, Tq, Tk)
    if allowed is not None:
        any_key = allowed.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq, 1)
        probs = probs * any_key  # fully masked query rows -> all-zero weights -> zero output
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p, training=True)
    out = probs @ v  # (B, n_heads, Tq, head_dim)
    return out.to(q.dtype)


def attend_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; returns ``(B, n_heads, Tq, head_dim)``.

    Without padding and with ``Tq == Tk`` (or no causality) it passes ``is_causal`` so fused
    flash/memory-efficient kernels apply. Otherwise it builds one boolean mask; rows with no
    visible key are unmasked before the call (some kernels return NaN for them) and zeroed after.
    """
    _check_shapes(q, k, v, key_padding_mask)
    B, n_heads, Tq, head_dim = q.shape
    Tk = k.shape[2]
    k = repeat_kv(k, n_heads)  # (B, n_heads, Tk, head_dim)
    v = repeat_kv(v, n_heads)  # (B, n_heads, Tk, head_dim)
    if bias is None and key_padding_mask is None and (not causal or Tq == Tk or Tq == 1):
        is_causal = causal and Tq == Tk and Tq > 1  # Tq == 1 after a cache: every key is visible
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
    if causal and Tq == 1:
        causal = False  # one new query after a KV cache sees every cached key
    allowed = _allowed_mask(B, Tq, Tk, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    if bias is not None:  # a float mask: the bias where allowed, -inf elsewhere (rows with no key: 0, zeroed below)
        mask = bias.to(q.dtype).expand(B, n_heads, Tq, Tk)
        if allowed is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        any_key = allowed.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq, 1)
        mask = mask.masked_fill(~(allowed | ~any_key), float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return out.masked_fill(~any_key, 0.0)  # (B, n_heads, Tq, head_dim)
    allowed = allowed if allowed is not None else torch.ones(1, 1, Tq, Tk, dtype=torch.bool, device=q.device)
    any_key = allowed.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~any_key, dropout_p=dropout_p)
    return out.masked_fill(~any_key, 0.0)  # (B, n_heads, Tq, head_dim)


_checked_mask: tuple[weakref.ref, int, torch.Tensor] | None = None


def _right_padding_lengths(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Key lengths ``(B,)`` int32 of a right-padded ``(B, Tk)`` mask; ``ValueError`` for any other mask.

    The check costs a device sync, so the result for the last mask object seen is reused (every
    layer of a forward pass gets the same source mask); an in-place edit of the mask is noticed
    through its version counter.
    """
    global _checked_mask
    if _checked_mask is not None:
        ref, version, lengths = _checked_mask
        if ref() is key_padding_mask and version == key_padding_mask._version:
            return lengths
    Tk = key_padding_mask.shape[1]
    lengths = (~key_padding_mask).sum(dim=1)  # (B,)
    right_padded = torch.arange(Tk, device=key_padding_mask.device)[None, :] >= lengths[:, None]  # (B, Tk)
    if not torch.equal(right_padded, key_padding_mask):
        bad = (right_padded != key_padding_mask).any(dim=1).nonzero()[0, 0].item()
        raise ValueError(
            f"triton backend needs right padding; key_padding_mask row {bad} is {key_padding_mask[bad].int().tolist()}"
        )
    lengths = lengths.to(torch.int32)
    _checked_mask = (weakref.ref(key_padding_mask), key_padding_mask._version, lengths)
    return lengths


def attend_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton flash-attention kernel; returns ``(B, n_heads, Tq, head_dim)``.

    Raises ``ValueError`` for ``dropout_p > 0`` (the kernel has no dropout: set
    ``ModelConfig.attention_dropout=0`` or pick another backend), for a padding mask that is
    not right padding (pads must all come after the real keys of a row), for a ``bias``, for ``causal`` with
    ``1 < Tq != Tk`` (the kernel aligns causality top-left), and for non-CUDA tensors unless
    ``TRITON_INTERPRET=1``. Rows with zero real keys get zeros (the kernel guarantees it).
    """
    _check_shapes(q, k, v, key_padding_mask)
    if dropout_p > 0.0:
        raise ValueError(f"triton attention backend has no dropout, got dropout_p={dropout_p}")
    if bias is not None:
        raise ValueError("triton attention backend has no additive score bias (ALiBi); use 'sdpa'")
    B, n_heads, Tq, head_dim = q.shape
    Tk = k.shape[2]
    if causal and Tq == 1:
        causal = False  # one new query after a KV cache sees every cached key
    if causal and Tq != Tk:
        raise ValueError(f"triton backend: causal attention needs Tq == Tk (or Tq == 1), got Tq={Tq}, Tk={Tk}")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"triton backend got tensors on {q.device}; build the model on the CUDA device "
            "(Transformer(cfg, device='cuda')) or choose attention_backend='sdpa'"
        )
    key_lengths = None if key_padding_mask is None else _right_padding_lengths(key_padding_mask)  # (B,) int32
    from aiayn.kernels.flash_attention import flash_attention  # lazy: only when 'triton' is chosen

    k = repeat_kv(k, n_heads).contiguous()  # (B, n_heads, Tk, head_dim)
    v = repeat_kv(v, n_heads).contiguous()  # (B, n_heads, Tk, head_dim)
    # The kernel returns zeros (and zero gradients) for rows with key_lengths == 0.
    return flash_attention(q.contiguous(), k, v, causal=causal, key_lengths=key_lengths)  # (B, n_heads, Tq, head_dim)


BACKENDS: dict[str, AttendFn] = {"reference": attend_reference, "sdpa": attend_sdpa, "triton": attend_triton}


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def select_backend(name: str, device: torch.device | str | None = None) -> tuple[str, AttendFn]:
    """Resolve an attention backend name to ``(name, attend_fn)``; call once per model.

    ``'auto'`` picks ``'triton'`` when the model is built on a CUDA device (and CUDA is
    available and triton importable), else ``'sdpa'``. ``device`` is that device; ``None``
    means torch's default device (normally CPU). So ``Transformer(cfg)`` built on CPU and
    moved with ``.to('cuda')`` keeps ``'sdpa'`` (which runs anywhere); build with
    ``Transformer(cfg, device='cuda')`` to get the kernel. The choice is logged on the
    ``aiayn`` logger. Raises ``ValueError`` for an unknown name or for ``'triton'`` without
    an importable triton.
    """
    if name == "auto":
        device = torch.device(device) if device is not None else torch.get_default_device()
        on_cuda = device.type == "cuda" and torch.cuda.is_available()
        chosen = "triton" if on_cuda and _triton_importable() else "sdpa"
    elif name in BACKENDS:
        chosen = name
    else:
        choices = ["auto", *BACKENDS]
        raise ValueError(f"unknown attention backend {name!r}; choose one of {choices}")
    if chosen == "triton" and not _triton_importable():
        raise ValueError("attention_backend='triton' but the triton package is not importable")
    # PyTorch's CPU kernels decide the float sums on CPU (ATEN_CPU_CAPABILITY, aiayn.config.settings): say which.
    kernels = f", PyTorch CPU kernels {torch.backends.cpu.get_cpu_capability()}" if chosen == "sdpa" else ""
    logger.info("attention backend: %s (requested %r, device %s%s)", chosen, name, device, kernels)
    return chosen, BACKENDS[chosen]
