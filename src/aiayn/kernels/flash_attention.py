"""FlashAttention-2 style fused attention in Triton: forward and backward.

Computes scaled dot-product attention (Vaswani et al. 2017, Section 3.2.1,
eq. 1) ``softmax(Q K^T * sm_scale) V`` without materialising the ``(Tq, Tk)``
score matrix. The kernels and their maths (online softmax, the three backward
kernels) are in ``flash_kernels.py``; this module pads and checks the inputs,
chooses block sizes and grids, launches them and wraps them in autograd.

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
  they are starting points until ``benchmarks/gpu/attention_speed.py`` runs there.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import triton

from aiayn.kernels.flash_kernels import _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_preprocess, _attn_fwd
from aiayn.config.settings import Settings

__all__ = ["flash_attention", "flash_attention_forward", "SUPPORTED_DTYPES", "MAX_HEAD_DIM", "INTERPRETED"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
_MAX_GRID_Y = 65535  # CUDA limit on gridDim.y (we put B * n_heads there)


# --------------------------------------------------------------------------- launch configuration


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older versions read the variable directly
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# True when the kernels (flash_kernels.py) were decorated under TRITON_INTERPRET=1 (numpy on CPU).
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
# dots run on CUDA cores, not tensor cores, and need many registers (compiled
# for sm_90 they spill from head_dim 32 on); these keep shared memory <= 85 KiB
# at head_dim 128 (84.1 KiB, dkdv; fits Ampere and Hopper). It is a
# correctness path: use bf16/fp16 (autocast) for speed.
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
