"""The Triton kernels of ``flash_attention`` (FlashAttention-2 style), forward and backward.

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

Each kernel takes raw pointers and strides of ``(B, n_heads, T, head_dim)`` tensors and runs one
program per (block of rows, batch * head). They check nothing: ``flash_attention.py`` pads and
checks the inputs, chooses block sizes (autotuning) and grids, and is their only caller.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Softmax runs on exp2 (one fast instruction): exp(x) = exp2(x * LOG2E), log(x) = log2(x) * LN2.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


# --------------------------------------------------------------------------- shared by the kernels (inlined)


@triton.jit
def _head_base(Ptr, off_z, off_h, stride_z, stride_h):
    """Pointer to the (T, head_dim) slice of batch row ``off_z``, head ``off_h`` (int64 offsets)."""
    return Ptr + off_z.to(tl.int64) * stride_z + off_h.to(tl.int64) * stride_h


@triton.jit
def _key_count(KeyLengths, off_z, k_len, HAS_KEY_LENGTHS: tl.constexpr):
    """Keys batch row ``off_z`` may attend to: ``min(key_lengths[off_z], Tk)``, or ``Tk`` without them."""
    kv_len = k_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(KeyLengths + off_z).to(tl.int32), k_len)
    return kv_len


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
    q_base = _head_base(Q, off_z, off_h, stride_qz, stride_qh)
    k_base = _head_base(K, off_z, off_h, stride_kz, stride_kh)
    v_base = _head_base(V, off_z, off_h, stride_vz, stride_vh)
    o_base = _head_base(Out, off_z, off_h, stride_oz, stride_oh)

    kv_len = _key_count(KeyLengths, off_z, k_len, HAS_KEY_LENGTHS)

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
    o_ptrs = _head_base(Out, off_z, off_h, stride_oz, stride_oh) + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    do_ptrs = _head_base(DO, off_z, off_h, stride_doz, stride_doh) \
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
    q_base = _head_base(Q, off_z, off_h, stride_qz, stride_qh)
    k_base = _head_base(K, off_z, off_h, stride_kz, stride_kh)
    v_base = _head_base(V, off_z, off_h, stride_vz, stride_vh)
    do_base = _head_base(DO, off_z, off_h, stride_doz, stride_doh)
    lse_base = LSE + off_hz.to(tl.int64) * q_len
    delta_base = Delta + off_hz.to(tl.int64) * q_len

    kv_len = _key_count(KeyLengths, off_z, k_len, HAS_KEY_LENGTHS)

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
    q_base = _head_base(Q, off_z, off_h, stride_qz, stride_qh)
    k_base = _head_base(K, off_z, off_h, stride_kz, stride_kh)
    v_base = _head_base(V, off_z, off_h, stride_vz, stride_vh)
    do_base = _head_base(DO, off_z, off_h, stride_doz, stride_doh)

    kv_len = _key_count(KeyLengths, off_z, k_len, HAS_KEY_LENGTHS)

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
