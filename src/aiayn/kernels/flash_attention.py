"""FlashAttention-2 style fused attention in Triton: forward and backward.

Computes scaled dot-product attention (Vaswani et al. 2017, Section 3.2.1,
eq. 1) ``softmax(Q K^T * sm_scale) V`` without ever materialising the
``(Tq, Tk)`` score matrix: each program holds one block of queries, streams
blocks of keys/values through on-chip memory and keeps a running max and sum
("online softmax", Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022,
Algorithm 1; FlashAttention-2, Dao 2023, Algorithms 1-2). The forward pass
saves the per-row log-sum-exp ``lse`` (float32) so the backward pass can
recompute the probabilities block by block::

    P_ij  = exp(sm_scale * q_i . k_j - lse_i)
    dV    = P^T dO
    dP    = dO V^T
    delta = rowsum(dO * O)                    (FlashAttention-2, Alg. 2, line 4)
    dS    = P * (dP - delta)
    dQ    = sm_scale * dS K,   dK = sm_scale * dS^T Q

The backward is three kernels: ``delta`` (preprocess), ``dK, dV`` (one program
per key block, looping over query blocks) and ``dQ`` (one program per query
block, looping over key blocks), so no atomics are needed.

Layout follows Triton tutorial 06 (fused attention). What the kernel supports,
honestly:

* q ``(B, n_heads, Tq, head_dim)``, k/v ``(B, n_heads, Tk, head_dim)``, same
  ``n_heads`` (grouped-query attention: repeat the kv heads before calling).
* Any ``Tq``/``Tk >= 1``: tails are masked, not padded.
* ``head_dim`` 1..128. The kernel itself runs ``HEAD_DIM`` in {16, 32, 64,
  128}; other sizes are zero-padded up to the next of those by the launcher
  (exact, but costs a copy of q/k/v). 256 is not supported (on-chip memory).
* ``causal``: top-left aligned (query ``i`` sees keys ``j <= i``), only with
  ``Tq == Tk``. Incremental decoding with a kv cache, where one new query sees
  every cached key, is ``causal=False``.
* ``key_lengths`` ``(B,)``: keys ``j >= key_lengths[b]`` are masked (right
  padding). Values are checked to lie in ``[0, Tk]`` (one host sync per call).
* A query row that sees no key (``key_lengths[b] == 0``) gives a zero output,
  zero gradients and ``lse = -inf``, never NaN.
* float32 / float16 / bfloat16 inputs, float32 accumulation and softmax
  statistics, output and gradients in the input dtype. float32 inputs use
  IEEE fp32 dot products unless ``torch.get_float32_matmul_precision()`` allows
  TF32. No dropout, no attention bias, no dense (arbitrary) masks.
* ``B * n_heads <= 65535`` (CUDA grid y-dimension limit).
* Under ``TRITON_INTERPRET=1`` (CPU tests) the kernels run on numpy, one
  program at a time, with small fixed blocks and no autotuning; the
  interpreter has no bfloat16 matmul, so bf16 inputs are computed in float32
  there (the GPU path uses bf16 tensor-core dots). On CUDA the block sizes are
  autotuned per (sequence-length bucket, head_dim, causal, key_lengths given,
  dtype) from a short list meant for Ampere/Hopper; ``AIAYN_FLASH_AUTOTUNE=0``
  uses the first config of each list instead; float32 always uses one fixed
  small config (a correctness path, slow). The lists were checked by compiling
  for sm_90 (registers, spills, shared memory) but not yet timed on a GPU:
  they are starting points until ``benchmarks/attention.py`` runs there.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import triton
import triton.language as tl

from aiayn.settings import Settings

__all__ = ["flash_attention", "flash_attention_forward", "SUPPORTED_DTYPES", "MAX_HEAD_DIM", "INTERPRETED"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
_MAX_GRID_Y = 65535  # CUDA limit on gridDim.y (we put B * n_heads there)
# Softmax runs on exp2 (one fast instruction): exp(x) = exp2(x * LOG2E), log(x) = log2(x) * LN2.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


# --------------------------------------------------------------------------- forward


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,  #
    k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
    offs_m, offs_n, offs_d, lo, hi, kv_len, qk_scale,  #
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update over key blocks [lo, hi). MASKED: apply key-length/causal masks."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kk
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < kv_len, other=0.0)  # (BLOCK_N, HEAD_DIM)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            valid = cols[None, :] < kv_len
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))  # (BLOCK_M,) running max
        if MASKED:
            # A row with no visible key so far keeps m = -inf; shift by 0 instead so
            # exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN. (With top-left
            # causal + right padding every row sees key 0 in its first block, so
            # this is a guard, not a path the current masks reach.)
            m_shift = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        else:
            m_shift = m_ij
        p = tl.math.exp2(qk - m_shift[:, None])  # (BLOCK_M, BLOCK_N)
        alpha = tl.math.exp2(m_i - m_shift)  # rescale of the old statistics
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=cols[:, None] < kv_len, other=0.0)  # (BLOCK_N, HEAD_DIM)
        else:
            v = tl.load(v_ptrs)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BLOCK_M, HEAD_DIM)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(
    Q, K, V, Out, LSE, KeyLengths, sm_scale,  #
    stride_qz, stride_qh, stride_qm, stride_qk,  #
    stride_kz, stride_kh, stride_kn, stride_kk,  #
    stride_vz, stride_vh, stride_vn, stride_vk,  #
    stride_oz, stride_oh, stride_om, stride_ok,  #
    n_heads, q_len, k_len, seq_bucket,  # seq_bucket: autotune key only
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
    IS_CAUSAL: tl.constexpr, HAS_KEY_LENGTHS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program = BLOCK_M queries of one (batch, head). Grid: (cdiv(Tq, BLOCK_M), B * n_heads)."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the causal diagonal starts on a key-block boundary
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // n_heads
    off_h = off_hz % n_heads
    q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    o_base = Out + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh

    kv_len = k_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(KeyLengths + off_z).to(tl.int32), k_len)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E  # scores in log2 units

    # Key blocks [0, full_end) need no mask; [full_end, hi) hold the causal
    # diagonal and/or the key-length tail and are masked.
    if IS_CAUSAL:
        hi = tl.minimum(kv_len, (start_m + 1) * BLOCK_M)
        full_end = tl.minimum(start_m * BLOCK_M, (kv_len // BLOCK_N) * BLOCK_N)
    else:
        hi = kv_len
        full_end = (kv_len // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
        offs_m, offs_n, offs_d, 0, full_end, kv_len, qk_scale,  #
        BLOCK_N, False, IS_CAUSAL, DOT_PRECISION,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
        offs_m, offs_n, offs_d, full_end, hi, kv_len, qk_scale,  #
        BLOCK_N, True, IS_CAUSAL, DOT_PRECISION,
    )

    # Epilogue: a row that saw no key has l = 0, m = -inf -> out 0, lse -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)  # natural-log units
    tl.store(LSE + off_hz.to(tl.int64) * q_len + offs_m, lse, mask=row_ok)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------- backward


@triton.jit
def _attn_bwd_preprocess(
    Out, DO, Delta,  #
    stride_oz, stride_oh, stride_om, stride_ok,  #
    stride_doz, stride_doh, stride_dom, stride_dok,  #
    n_heads, q_len,  #
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta_i = sum_d dO_id * O_id (float32). Grid: (cdiv(Tq, BLOCK_M), B * n_heads)."""
    off_hz = tl.program_id(1)
    off_z = off_hz // n_heads
    off_h = off_hz % n_heads
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    o_ptrs = Out + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh \
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    do_ptrs = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh \
        + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dok
    o = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)  # (BLOCK_M,)
    tl.store(Delta + off_hz.to(tl.int64) * q_len + offs_m, delta, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,  #
    q_base, do_base, lse_base, delta_base,  #
    stride_qm, stride_qk, stride_dom, stride_dok,  #
    offs_n, offs_d, lo, hi, q_len, qk_scale,  #
    BLOCK_M1: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Accumulate dK, dV of one key block over query blocks [lo, hi). MASKED: causal diagonal."""
    for start_m in range(lo, hi, BLOCK_M1):
        start_m = tl.multiple_of(start_m, BLOCK_M1)
        offs_m = start_m + tl.arange(0, BLOCK_M1)  # (BLOCK_M1,) query positions
        row_ok = offs_m < q_len
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk,
                    mask=row_ok[:, None], other=0.0)  # (BLOCK_M1, HEAD_DIM)
        # Rows past Tq get lse = +inf, hence P = 0: they contribute nothing.
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N1, BLOCK_M1)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])  # P^T
        if MASKED:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dok,
                     mask=row_ok[:, None], other=0.0)  # (BLOCK_M1, HEAD_DIM)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # dV += P^T dO
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (dO V^T)^T, (BLOCK_N1, BLOCK_M1)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # dK += dS^T Q (unscaled)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, DK, DV, LSE, Delta, KeyLengths, sm_scale,  #
    stride_qz, stride_qh, stride_qm, stride_qk,  #
    stride_kz, stride_kh, stride_kn, stride_kk,  #
    stride_vz, stride_vh, stride_vn, stride_vk,  #
    stride_doz, stride_doh, stride_dom, stride_dok,  #
    stride_dkz, stride_dkh, stride_dkn, stride_dkk,  # shared by DK and DV (same shape, both contiguous)
    n_heads, q_len, k_len, seq_bucket,  #
    HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,  #
    IS_CAUSAL: tl.constexpr, HAS_KEY_LENGTHS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program = BLOCK_N1 keys of one (batch, head). Grid: (cdiv(Tk, BLOCK_N1), B * n_heads)."""
    tl.static_assert(BLOCK_N1 % BLOCK_M1 == 0)  # the causal diagonal ends on a query-block boundary
    start_n = tl.program_id(0) * BLOCK_N1
    off_hz = tl.program_id(1)
    off_z = off_hz // n_heads
    off_h = off_hz % n_heads
    q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    do_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
    lse_base = LSE + off_hz.to(tl.int64) * q_len
    delta_base = Delta + off_hz.to(tl.int64) * q_len

    kv_len = k_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(KeyLengths + off_z).to(tl.int32), k_len)

    offs_n = start_n + tl.arange(0, BLOCK_N1)  # (BLOCK_N1,) key positions
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < kv_len
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk, mask=key_ok[:, None], other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vk, mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    # A block of masked-out keys (start_n >= kv_len) skips both loops.
    q_hi = tl.where(start_n < kv_len, q_len, 0)
    if IS_CAUSAL:
        # Queries i < start_n see none of these keys; [start_n, start_n + BLOCK_N1)
        # is the diagonal (masked); beyond it every query sees every key here.
        diag_end = tl.minimum(start_n + BLOCK_N1, q_hi)
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base,  #
            stride_qm, stride_qk, stride_dom, stride_dok,  #
            offs_n, offs_d, start_n, diag_end, q_len, qk_scale,  #
            BLOCK_M1, True, DOT_PRECISION,
        )
        lo = start_n + BLOCK_N1
    else:
        lo = 0
    dk, dv = _attn_bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base,  #
        stride_qm, stride_qk, stride_dom, stride_dok,  #
        offs_n, offs_d, lo, q_hi, q_len, qk_scale,  #
        BLOCK_M1, False, DOT_PRECISION,
    )

    # Keys past key_lengths get exactly zero gradient (their rows above are
    # independent of the valid ones, so they are simply overwritten).
    dk = tl.where(key_ok[:, None], dk * sm_scale, 0.0)
    dv = tl.where(key_ok[:, None], dv, 0.0)
    store_ok = offs_n[:, None] < k_len
    d_off = off_z.to(tl.int64) * stride_dkz + off_h.to(tl.int64) * stride_dkh \
        + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkk
    tl.store(DK + d_off, dk.to(DK.dtype.element_ty), mask=store_ok)
    tl.store(DV + d_off, dv.to(DV.dtype.element_ty), mask=store_ok)


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, lse2, delta,  #
    k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
    offs_m, offs_n, offs_d, lo, hi, kv_len, qk_scale,  #
    BLOCK_N2: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Accumulate dQ of one query block over key blocks [lo, hi). MASKED: key-length/causal masks."""
    for start_n in range(lo, hi, BLOCK_N2):
        start_n = tl.multiple_of(start_n, BLOCK_N2)
        cols = start_n + offs_n  # (BLOCK_N2,) key positions
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kk
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < kv_len, other=0.0)  # (BLOCK_N2, HEAD_DIM)
            v = tl.load(v_ptrs, mask=cols[:, None] < kv_len, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M2, BLOCK_N2)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            valid = cols[None, :] < kv_len
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            p = tl.where(valid, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BLOCK_M2, BLOCK_N2)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # dQ += dS K (unscaled)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, DQ, LSE, Delta, KeyLengths, sm_scale,  #
    stride_qz, stride_qh, stride_qm, stride_qk,  #
    stride_kz, stride_kh, stride_kn, stride_kk,  #
    stride_vz, stride_vh, stride_vn, stride_vk,  #
    stride_doz, stride_doh, stride_dom, stride_dok,  #
    stride_dqz, stride_dqh, stride_dqm, stride_dqk,  #
    n_heads, q_len, k_len, seq_bucket,  #
    HEAD_DIM: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,  #
    IS_CAUSAL: tl.constexpr, HAS_KEY_LENGTHS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program = BLOCK_M2 queries of one (batch, head). Grid: (cdiv(Tq, BLOCK_M2), B * n_heads)."""
    tl.static_assert(BLOCK_M2 % BLOCK_N2 == 0)
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // n_heads
    off_h = off_hz % n_heads
    q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    do_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh

    kv_len = k_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(KeyLengths + off_z).to(tl.int32), k_len)

    offs_m = start_m * BLOCK_M2 + tl.arange(0, BLOCK_M2)  # (BLOCK_M2,) query positions
    offs_n = tl.arange(0, BLOCK_N2)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dok,
                 mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + off_hz.to(tl.int64) * q_len + offs_m, mask=row_ok, other=0.0) * LOG2E
    delta = tl.load(Delta + off_hz.to(tl.int64) * q_len + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    # Same split as the forward: unmasked key blocks, then the masked diagonal/tail.
    if IS_CAUSAL:
        hi = tl.minimum(kv_len, (start_m + 1) * BLOCK_M2)
        full_end = tl.minimum(start_m * BLOCK_M2, (kv_len // BLOCK_N2) * BLOCK_N2)
    else:
        hi = kv_len
        full_end = (kv_len // BLOCK_N2) * BLOCK_N2
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
        offs_m, offs_n, offs_d, 0, full_end, kv_len, qk_scale,  #
        BLOCK_N2, False, IS_CAUSAL, DOT_PRECISION,
    )
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,  #
        offs_m, offs_n, offs_d, full_end, hi, kv_len, qk_scale,  #
        BLOCK_N2, True, IS_CAUSAL, DOT_PRECISION,
    )
    dq_ptrs = DQ + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh \
        + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqk
    tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------- launch configuration


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older versions read the variable directly
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# True when the kernels above were decorated under TRITON_INTERPRET=1 (numpy on CPU).
INTERPRETED = _interpreting()
# AIAYN_FLASH_AUTOTUNE=0: on CUDA use the first config of each list below
# instead of autotuning (fewer compiles: tests, short checks).
AUTOTUNE = Settings.from_env().flash_autotune

# Interpreter (CPU tests): small fixed blocks, so short sequences still cross
# several blocks and the diagonal/tail logic is exercised; no autotuning.
INTERPRETER_BLOCKS = {
    "fwd": {"BLOCK_M": 32, "BLOCK_N": 16},
    "dkdv": {"BLOCK_M1": 16, "BLOCK_N1": 32},
    "dq": {"BLOCK_M2": 32, "BLOCK_N2": 16},
    "preprocess": {"BLOCK_M": 32},
}
_PREPROCESS_BLOCK_M = 64
_AUTOTUNE_KEY = ["seq_bucket", "HEAD_DIM", "IS_CAUSAL", "HAS_KEY_LENGTHS"]


def _cfg(num_warps: int, num_stages: int, **blocks: int) -> triton.Config:
    return triton.Config(blocks, num_warps=num_warps, num_stages=num_stages)


# GPU candidates (Ampere/Hopper). Every entry keeps the divisibility the causal
# split needs. The first entry of each list is the AIAYN_FLASH_AUTOTUNE=0
# choice: compiled ahead of time for sm_90 (bf16/fp16, head_dim 64 and 128) it
# fits in <= 252 registers per thread without spills and <= 128 KiB shared memory.
# Entries that do not fit a device fail to compile and the autotuner skips them.
_FWD_CONFIGS = [
    _cfg(8, 3, BLOCK_M=128, BLOCK_N=64),
    _cfg(8, 2, BLOCK_M=128, BLOCK_N=64),
    _cfg(8, 2, BLOCK_M=128, BLOCK_N=128),
    _cfg(4, 3, BLOCK_M=64, BLOCK_N=64),
    _cfg(8, 3, BLOCK_M=128, BLOCK_N=32),
]
_DKDV_CONFIGS = [
    _cfg(8, 3, BLOCK_M1=32, BLOCK_N1=128),
    _cfg(8, 2, BLOCK_M1=64, BLOCK_N1=128),
    _cfg(8, 3, BLOCK_M1=32, BLOCK_N1=64),
    _cfg(4, 3, BLOCK_M1=16, BLOCK_N1=64),
]
_DQ_CONFIGS = [
    _cfg(8, 3, BLOCK_M2=128, BLOCK_N2=32),
    _cfg(8, 2, BLOCK_M2=128, BLOCK_N2=64),
    _cfg(4, 3, BLOCK_M2=64, BLOCK_N2=32),
    _cfg(4, 2, BLOCK_M2=64, BLOCK_N2=64),
]
# float32 inputs: one fixed small-block config each (no autotuning). IEEE fp32
# dots run on CUDA cores, not tensor cores, and need many registers; these
# keep shared memory <= 84 KiB at head_dim 128 (fits Ampere and Hopper). It is
# a correctness path: use bf16/fp16 (autocast) for speed.
_FP32_CONFIGS = {
    "fwd": _cfg(4, 2, BLOCK_M=64, BLOCK_N=32),
    "dkdv": _cfg(4, 2, BLOCK_M1=16, BLOCK_N1=64),
    "dq": _cfg(4, 2, BLOCK_M2=32, BLOCK_N2=32),
}


def _tuning_bench(kernel_call, quantiles):
    """Shorter than Triton's default (25 ms warm-up, 100 ms timing): tuning runs once per key."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def _autotuned(kernel, configs):
    """Autotuned wrapper, or the first config only (AIAYN_FLASH_AUTOTUNE=0: no benchmarking)."""
    if not AUTOTUNE:
        configs = configs[:1]
    try:
        return triton.autotune(configs, key=_AUTOTUNE_KEY, do_bench=_tuning_bench)(kernel)
    except TypeError:  # triton < 3.2 has no do_bench argument
        return triton.autotune(configs, key=_AUTOTUNE_KEY)(kernel)


# Tuned once per (seq bucket, head_dim, causal, key_lengths given, dtypes); set
# TRITON_PRINT_AUTOTUNING=1 to log the winners.
_attn_fwd_tuned = _autotuned(_attn_fwd, _FWD_CONFIGS)
_attn_bwd_dkdv_tuned = _autotuned(_attn_bwd_dkdv, _DKDV_CONFIGS)
_attn_bwd_dq_tuned = _autotuned(_attn_bwd_dq, _DQ_CONFIGS)


def _launch(kernel, tuned, name: str, dtype: torch.dtype, grid_rows: int, grid_cols: int, block_arg: str,
            *args, **kwargs) -> None:
    """Run ``kernel`` with fixed interpreter blocks, the fixed fp32 config, or its autotuned wrapper.

    Grid: ``(cdiv(grid_rows, block), grid_cols)`` where ``block`` is the
    config's ``block_arg`` (rows handled per program).
    """
    if INTERPRETED:
        blocks = INTERPRETER_BLOCKS[name]
        kernel[(triton.cdiv(grid_rows, blocks[block_arg]), grid_cols)](*args, **kwargs, **blocks)
    elif dtype == torch.float32:
        cfg = _FP32_CONFIGS[name]
        grid = (triton.cdiv(grid_rows, cfg.kwargs[block_arg]), grid_cols)
        kernel[grid](*args, **kwargs, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    else:
        tuned[lambda meta: (triton.cdiv(grid_rows, meta[block_arg]), grid_cols)](*args, **kwargs)


def _seq_bucket(q_len: int, k_len: int) -> int:
    """Autotune key for sequence length: next power of two of max(Tq, Tk), at least 64."""
    return max(64, triton.next_power_of_2(max(q_len, k_len)))


def _dot_precision(dtype: torch.dtype) -> str | None:
    """fp32 inputs: IEEE unless torch allows TF32 matmuls; fp16/bf16: Triton's default (None)."""
    if dtype != torch.float32:
        return None
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _on_device(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it ``t``'s (multi-GPU processes)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# --------------------------------------------------------------------------- launchers (padded, checked inputs)


def _forward(q, k, v, causal: bool, key_lengths, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel launch on checked inputs with HEAD_DIM in {16, 32, 64, 128}. Returns (out, lse)."""
    batch, n_heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, n_heads, Tq, HEAD_DIM)
    lse = torch.empty((batch, n_heads, q_len), device=q.device, dtype=torch.float32)  # (B, n_heads, Tq)
    _launch(
        _attn_fwd, _attn_fwd_tuned, "fwd", q.dtype, q_len, batch * n_heads, "BLOCK_M",
        q, k, v, out, lse, key_lengths if key_lengths is not None else lse, sm_scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        n_heads, q_len, k_len, _seq_bucket(q_len, k_len),
        HEAD_DIM=head_dim, IS_CAUSAL=causal, HAS_KEY_LENGTHS=key_lengths is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    return out, lse


def _backward(do, q, k, v, out, lse, causal: bool, key_lengths, sm_scale: float):
    """Kernel launches for dq, dk, dv (input dtype) given dO and the saved forward state."""
    batch, n_heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    if do.stride(-1) != 1:
        do = do.contiguous()
    delta = torch.empty_like(lse)  # (B, n_heads, Tq) float32
    pre_block = INTERPRETER_BLOCKS["preprocess"]["BLOCK_M"] if INTERPRETED else _PREPROCESS_BLOCK_M
    _attn_bwd_preprocess[(triton.cdiv(q_len, pre_block), batch * n_heads)](
        out, do, delta, *_strides(out), *_strides(do), n_heads, q_len,
        HEAD_DIM=head_dim, BLOCK_M=pre_block,
    )
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    kl = key_lengths if key_lengths is not None else lse
    common = dict(HEAD_DIM=head_dim, IS_CAUSAL=causal, HAS_KEY_LENGTHS=key_lengths is not None,
                  DOT_PRECISION=_dot_precision(q.dtype))
    _launch(
        _attn_bwd_dkdv, _attn_bwd_dkdv_tuned, "dkdv", q.dtype, k_len, batch * n_heads, "BLOCK_N1",
        q, k, v, do, dk, dv, lse, delta, kl, sm_scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk),
        n_heads, q_len, k_len, _seq_bucket(q_len, k_len), **common,
    )
    _launch(
        _attn_bwd_dq, _attn_bwd_dq_tuned, "dq", q.dtype, q_len, batch * n_heads, "BLOCK_M2",
        q, k, v, do, dq, lse, delta, kl, sm_scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        n_heads, q_len, k_len, _seq_bucket(q_len, k_len), **common,
    )
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    """Autograd wrapper: forward saves (q, k, v, out, lse); backward runs the three backward kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, key_lengths, sm_scale: float):
        with _on_device(q):
            out, lse = _forward(q, k, v, causal, key_lengths, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse, key_lengths)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, key_lengths = ctx.saved_tensors
        with _on_device(q):
            dq, dk, dv = _backward(do, q, k, v, out, lse, ctx.causal, key_lengths, ctx.sm_scale)
        return dq, dk, dv, None, None, None


# --------------------------------------------------------------------------- public API


def _check_and_prepare(q, k, v, causal, key_lengths, sm_scale):
    """Validate inputs; return kernel-ready ``(q, k, v, key_lengths, sm_scale, head_dim)``.

    q/k/v come back cast to the compute dtype, zero-padded to a kernel HEAD_DIM
    and with unit last-dim stride; ``head_dim`` is the caller's (for slicing).

    Raises ValueError quoting the offending value.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, n_heads, T, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}.dtype={t.dtype} is not supported; use one of {SUPPORTED_DTYPES}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if not INTERPRETED and q.device.type != "cuda":
        raise ValueError(f"flash_attention needs CUDA tensors (got device {q.device}); on CPU set TRITON_INTERPRET=1")
    batch, n_heads, q_len, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: k={tuple(k.shape)}, v={tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"batch mismatch: q has B={batch}, k/v have B={k.shape[0]}")
    if k.shape[1] != n_heads:
        raise ValueError(
            f"head mismatch: q has n_heads={n_heads}, k/v have {k.shape[1]} (repeat kv heads for GQA before calling)"
        )
    if k.shape[3] != head_dim:
        raise ValueError(f"head_dim mismatch: q has {head_dim}, k/v have {k.shape[3]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported; the kernel handles 1..{MAX_HEAD_DIM}")
    k_len = k.shape[2]
    if q_len < 1 or k_len < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Tq={q_len}, Tk={k_len}")
    if causal and q_len != k_len:
        raise ValueError(f"causal=True needs Tq == Tk (top-left aligned), got Tq={q_len}, Tk={k_len}")
    if batch * n_heads > _MAX_GRID_Y:
        raise ValueError(f"B * n_heads = {batch * n_heads} exceeds the grid limit {_MAX_GRID_Y}")
    if key_lengths is not None:
        if not isinstance(key_lengths, torch.Tensor):
            raise ValueError(f"key_lengths must be a tensor of shape ({batch},), got {type(key_lengths).__name__}")
        if key_lengths.shape != (batch,):
            raise ValueError(f"key_lengths must have shape ({batch},), got {tuple(key_lengths.shape)}")
        if key_lengths.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"key_lengths.dtype={key_lengths.dtype}; use torch.int32 or torch.int64")
        if key_lengths.device != q.device:
            raise ValueError(f"key_lengths is on {key_lengths.device}, q on {q.device}")
        lo, hi = torch.stack([key_lengths.min(), key_lengths.max()]).tolist()  # one host sync
        if lo < 0 or hi > k_len:
            raise ValueError(f"key_lengths must lie in [0, Tk={k_len}], got min={lo}, max={hi}")
        key_lengths = key_lengths.to(torch.int32).contiguous()
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not math.isfinite(scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")

    # Interpreter: numpy has no bf16 matmul -> compute bf16 in float32 there.
    compute_dtype = torch.float32 if (INTERPRETED and q.dtype == torch.bfloat16) else q.dtype
    kernel_dim = max(16, triton.next_power_of_2(head_dim))
    prepared = []
    for t in (q, k, v):
        t = t.to(compute_dtype)
        if kernel_dim != head_dim:
            t = torch.nn.functional.pad(t, (0, kernel_dim - head_dim))  # (B, n_heads, T, kernel_dim), zeros
        if t.stride(-1) != 1:
            t = t.contiguous()
        prepared.append(t)
    return (*prepared, key_lengths, scale, head_dim)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_lengths: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Fused scaled dot-product attention (differentiable), FlashAttention-2 style.

    Args:
        q: ``(B, n_heads, Tq, head_dim)``, float32/float16/bfloat16.
        k, v: ``(B, n_heads, Tk, head_dim)``, same dtype and device as ``q``.
        causal: query ``i`` sees keys ``j <= i`` (needs ``Tq == Tk``).
        key_lengths: ``(B,)`` int32/int64, valid keys per batch row (right
            padding), each in ``[0, Tk]``; ``0`` gives zero output rows.
        sm_scale: score scale; default ``1 / sqrt(head_dim)`` (paper eq. 1).

    Returns:
        ``(B, n_heads, Tq, head_dim)`` in ``q.dtype``.

    Raises:
        ValueError: bad shape, dtype, device, ``head_dim > 128``, causal with
            ``Tq != Tk``, or ``key_lengths`` of the wrong shape/dtype/range.

    Limits: see the module docstring.
    """
    qp, kp, vp, key_lengths, scale, head_dim = _check_and_prepare(q, k, v, causal, key_lengths, sm_scale)
    out = _FlashAttention.apply(qp, kp, vp, bool(causal), key_lengths, scale)  # (B, n_heads, Tq, kernel_dim)
    return out[..., :head_dim].to(q.dtype)  # (B, n_heads, Tq, head_dim)


def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_lengths: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only, no autograd: returns ``(out, lse)``.

    ``out`` ``(B, n_heads, Tq, head_dim)`` in ``q.dtype``; ``lse`` ``(B, n_heads, Tq)``
    float32, natural-log log-sum-exp of the scaled masked scores (``-inf`` for
    a row that sees no key). Arguments and errors as ``flash_attention``.
    """
    qp, kp, vp, key_lengths, scale, head_dim = _check_and_prepare(q, k, v, causal, key_lengths, sm_scale)
    with torch.no_grad(), _on_device(qp):
        out, lse = _forward(qp, kp, vp, bool(causal), key_lengths, scale)
    return out[..., :head_dim].to(q.dtype), lse
