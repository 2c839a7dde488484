"""Compile the flash-attention kernels ahead of time for a GPU that is not here (no CUDA needed).

Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests) accepts code its compiler rejects, and a
CPU-only machine cannot launch a compiled kernel. This module compiles each kernel of
``flash_kernels.py`` the way a real launch would specialise it (bf16 tensors by default, or fp16 or
fp32; ``head_dim`` 128; the default block config; last-dim strides equal to 1, pointers and strides
multiples of 16) for an NVIDIA target (``sm_90``, H100/H200, by default) and reads what ``ptxas``
(shipped in the triton wheel) says about registers and spills. Used by ``tests/test_flash_attention.py``
(the default configs fit Hopper without spills) and ``benchmarks/gpu/kernel_ptx.py`` (the PTX of every
kernel, to show that a change to the kernels' Python is behaviour-neutral without a GPU).

Call it in a process where ``TRITON_INTERPRET`` is unset or ``0`` when ``aiayn.kernels`` is first
imported: kernels decorated for the interpreter cannot be compiled.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import tempfile
from typing import Any, NamedTuple

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

# The module, not the function of that name which the package re-exports.
_launch = importlib.import_module("aiayn.kernels.flash_attention")
try:
    from aiayn.kernels import flash_kernels
except ImportError:  # a revision before 48b3fc7, compiled by benchmarks/gpu/kernel_ptx.py --rev: one module held both
    flash_kernels = _launch

#: kernel name -> (its tensor arguments of the input dtype, its default launch config). The preprocess
#: kernel is not autotuned: one block size, 4 warps.
KERNELS: dict[str, tuple[tuple[str, ...], Any]] = {
    "_attn_fwd": (("Q", "K", "V", "Out"), _launch._FWD_CONFIGS[0]),
    "_attn_bwd_preprocess": (("Out", "DO"), triton.Config({"BLOCK_M": _launch._PREPROCESS_BLOCK_M}, num_warps=4)),
    "_attn_bwd_dkdv": (("Q", "K", "V", "DO", "DK", "DV"), _launch._DKDV_CONFIGS[0]),
    "_attn_bwd_dq": (("Q", "K", "V", "DO", "DQ"), _launch._DQ_CONFIGS[0]),
}


#: Input dtypes the kernels take (``flash_attention.SUPPORTED_DTYPES``), as Triton names them.
DTYPES = ("bf16", "fp16", "fp32")
#: kernel name -> its key in ``_launch._FP32_CONFIGS`` (the preprocess kernel has one config for all dtypes).
_FP32_NAMES = {"_attn_fwd": "fwd", "_attn_bwd_dkdv": "dkdv", "_attn_bwd_dq": "dq"}


class Compiled(NamedTuple):
    """One kernel compiled for one target."""

    kernel: str  #: its name in ``flash_kernels.py``
    config: str  #: the launch config (block sizes, warps, stages)
    ptx: str  #: the PTX text, DWARF debug section included
    shared: int  #: shared memory per program (bytes)


def compile_kernel(name: str, causal: bool = True, key_lengths: bool = True, head_dim: int = 128,
                   arch: int = 90, dtype: str = "bf16") -> Compiled:
    """Compile kernel ``name`` (a key of ``KERNELS``) for ``sm_<arch>``: ``dtype`` inputs (one of ``DTYPES``),
    float32 ``LSE`` and ``Delta``, ``head_dim`` in {16, 32, 64, 128}. ``causal``/``key_lengths`` pick the
    variant (ignored by the preprocess kernel, which has neither). bf16 and fp16 take the default config of
    ``KERNELS``; fp32 the fixed config a float32 launch takes (``_FP32_CONFIGS``) with IEEE dots.

    Raises:
        KeyError: ``name`` is not one of ``KERNELS``.
        RuntimeError: the kernels were decorated for the interpreter (``TRITON_INTERPRET=1``).
        triton.CompilationError: Triton rejects the kernel for this target.
    """
    if _launch.INTERPRETED:
        raise RuntimeError("the kernels were decorated under TRITON_INTERPRET=1; compile in a process without it")
    if dtype not in DTYPES:
        raise KeyError(f"dtype {dtype!r}: one of {DTYPES}")
    tensor_args, cfg = KERNELS[name]
    precision = None
    if dtype == "fp32":  # what _launch runs for float32 inputs (torch's default matmul precision: IEEE)
        cfg = _launch._FP32_CONFIGS.get(_FP32_NAMES.get(name, ""), cfg)
        precision = "ieee"
    fn = getattr(flash_kernels, name)
    wanted = dict(HEAD_DIM=head_dim, IS_CAUSAL=causal, HAS_KEY_LENGTHS=key_lengths, DOT_PRECISION=precision,
                  **cfg.kwargs)
    constexprs = {n: v for n, v in wanted.items() if n in fn.arg_names}
    # Like a real launch: int arguments equal to 1 (the last-dim strides) become constexprs.
    constexprs.update({n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("k")})
    signature: dict[str, str] = {}
    attrs: dict[tuple[int], list[list[Any]]] = {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
        else:
            signature[arg] = (f"*{dtype}" if arg in tensor_args else "*fp32" if arg in ("LSE", "Delta")
                              else "*i32" if arg == "KeyLengths" else "fp32" if arg == "sm_scale" else "i32")
        if signature[arg].startswith("*") or arg.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return Compiled(name, str(cfg), kernel.asm["ptx"], kernel.metadata.shared)


def ptxas_path() -> str:
    """The ``ptxas`` in the triton wheel (it may be absent: check with ``os.path.exists``)."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_usage(ptx: str, arch: int = 90) -> dict[str, list[int]]:
    """``ptxas -v`` on ``ptx`` for ``sm_<arch>a``: ``registers`` per thread and ``spill_stores`` (bytes),
    one entry per function.

    Raises:
        FileNotFoundError: no ``ptxas`` in the triton wheel.
        subprocess.CalledProcessError: ``ptxas`` rejects the PTX.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w", encoding="utf-8") as f:
            f.write(ptx)
        report = subprocess.run([ptxas_path(), f"-arch=sm_{arch}a", "-v", path, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    return {"registers": [int(n) for n in re.findall(r"Used (\d+) registers", report)],
            "spill_stores": [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]}


def ptx_code(ptx: str) -> str:
    """The PTX without what a move of the Python source changes and the machine code does not: the DWARF
    debug section (file names, line numbers), the ``.loc``/``.file`` directives, comments, and the
    ``$L__tmpN:`` labels that mark inlined calls for that section (never branch targets: those are
    ``$L__BB...``), so a helper ``@triton.jit`` function the compiler inlines compares equal to its body."""
    code = re.split(r"^\s*\.section\s+\.debug", ptx, maxsplit=1, flags=re.M)[0]
    return "\n".join(line for line in code.splitlines()
                     if not line.strip().startswith((".loc", ".file", "//")) and not _DEBUG_LABEL.match(line))


_DEBUG_LABEL = re.compile(r"^\$L__tmp\d+:\s*$")
