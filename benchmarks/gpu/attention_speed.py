"""Attention speed: the Triton flash kernel vs PyTorch SDPA (flash and efficient backends).

Usage (CUDA only)::

    TRITON_INTERPRET=0 python benchmarks/gpu/attention_speed.py [--out attention-bench.md]
        [--seq-lens 512,1024,2048,4096,8192,16384] [--head-dims 64,128] [--causal both]

Shapes follow the FlashAttention-2 paper's benchmark (Dao 2023, Section 4.1):
total tokens ``B * T = 16384`` (so ``B = 16384 // T``, at least 1) and hidden
size 2048, i.e. ``n_heads = 2048 // head_dim`` (32 heads at head_dim 64, 16 at
128); bf16; q, k, v ``(B, n_heads, T, head_dim)`` contiguous.

Timing: ``triton.testing.do_bench`` (CUDA events, L2 flushed before every
run), median over repeats after warm-up (``--warmup-ms``, ``--rep-ms``). The
first call of each shape (compilation, autotuning) happens before timing.

FLOPs: forward ``4 * B * n_heads * Tq * Tk * head_dim`` (two matmuls, 2 FLOPs
per multiply-add), halved for causal; backward is 2.5x forward (five matmuls,
one of them the recomputation of the scores), so forward+backward counts
``3.5x`` forward. (Triton tutorial 06's "bwd" mode times the backward alone,
which is 2.5x.) TFLOP/s = FLOPs / time.

Prints a markdown table (ms, TFLOP/s, the Triton/SDPA-flash speed ratio,
>1 = Triton faster, and for forward rows max |triton - sdpa-flash| on the same
inputs as a sanity check of the tuned configs); ``--out FILE`` also writes it
(atomically, after every row), with the GPU name, torch/triton versions and
the date. Exit status: 0, 1 if a sanity difference exceeds ``MAX_DIFF_BF16``,
2 (with a message) when there is no CUDA device. ``run_gpu.sh`` runs it; results: docs/results.md, "Triton flash
attention on GPU".
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.harness import markdown_row, markdown_table

TOTAL_TOKENS = 16384  # B * T per measurement (FlashAttention-2 benchmark convention)
HIDDEN = 2048  # n_heads * head_dim
PROVIDERS = ("triton", "sdpa-flash", "sdpa-efficient")
MAX_DIFF_BF16 = 3e-2  # sanity bound on max |triton - sdpa-flash| (bf16 outputs of size ~1: a few ulps)


@dataclass
class Row:
    seq_len: int
    head_dim: int
    causal: bool
    mode: str  # "fwd" or "fwd+bwd"
    batch: int
    n_heads: int
    ms: dict[str, float]  # provider -> milliseconds (nan: not supported)
    tflops: dict[str, float]
    max_diff: float = float("nan")  # fwd rows: max |triton - sdpa-flash| on the same inputs


def attention_flops(batch: int, n_heads: int, q_len: int, k_len: int, head_dim: int, causal: bool, mode: str) -> float:
    """FLOPs of one attention call: 4*B*H*Tq*Tk*d forward (x0.5 causal); fwd+bwd = 3.5x forward."""
    flops = 4.0 * batch * n_heads * q_len * k_len * head_dim
    if causal:
        flops *= 0.5
    return flops * (3.5 if mode == "fwd+bwd" else 1.0)


def _provider_fn(provider: str, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aiayn.kernels.flash_attention import flash_attention

    if provider == "triton":
        return lambda q, k, v: flash_attention(q, k, v, causal=causal)
    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[provider]

    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _inputs(seq_len: int, head_dim: int, dtype: torch.dtype):
    """Seeded q, k, v ``(B, n_heads, T, head_dim)`` on CUDA (B = TOTAL_TOKENS // T, n_heads = HIDDEN // head_dim)."""
    batch = max(1, TOTAL_TOKENS // seq_len)
    n_heads = HIDDEN // head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, n_heads, seq_len, head_dim)
    return tuple(torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))


def time_one(provider: str, seq_len: int, head_dim: int, causal: bool, mode: str, *, warmup_ms: int, rep_ms: int,
             dtype: torch.dtype = torch.bfloat16) -> tuple[float, int, int]:
    """Median milliseconds of one call (fwd) or one forward+backward; returns (ms, B, n_heads)."""
    import triton.testing

    q, k, v = _inputs(seq_len, head_dim, dtype)
    batch, n_heads = q.shape[:2]
    fn = _provider_fn(provider, causal)
    if mode == "fwd":
        def step():
            with torch.no_grad():
                fn(q, k, v)
    else:
        for t in (q, k, v):
            t.requires_grad_(True)
        do = torch.randn_like(q)

        def step():
            fn(q, k, v).backward(do)

    step()  # compile / autotune outside the timed region
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(step, warmup=warmup_ms, rep=rep_ms, grad_to_none=[q, k, v], return_mode="median")
    return float(ms), batch, n_heads


def max_diff_vs_sdpa(seq_len: int, head_dim: int, causal: bool, dtype: torch.dtype = torch.bfloat16) -> float:
    """Sanity check next to the timings: max |triton - sdpa-flash| forward output on the same inputs."""
    q, k, v = _inputs(seq_len, head_dim, dtype)
    with torch.no_grad():
        a = _provider_fn("triton", causal)(q, k, v)
        b = _provider_fn("sdpa-flash", causal)(q, k, v)
    return (a.float() - b.float()).abs().max().item()


HEADER = ["seq", "head_dim", "causal", "mode", "B x H", *(f"{p} ms" for p in PROVIDERS),
          *(f"{p} TFLOP/s" for p in PROVIDERS), "triton / sdpa-flash", "max abs diff"]


def table_row(r: Row) -> str:
    """One Markdown row of ``r``."""
    ratio = r.ms["sdpa-flash"] / r.ms["triton"] if r.ms["triton"] == r.ms["triton"] else float("nan")
    return markdown_row([r.seq_len, r.head_dim, "yes" if r.causal else "no", r.mode, f"{r.batch} x {r.n_heads}",
                         *(f"{r.ms[p]:.3f}" for p in PROVIDERS), *(f"{r.tflops[p]:.0f}" for p in PROVIDERS),
                         f"{ratio:.2f}x", f"{r.max_diff:.1e}"])


def format_table(rows: list[Row]) -> str:
    return "\n".join([markdown_table(HEADER, []), *(table_row(r) for r in rows)])


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=_ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=_ints, default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--modes", default="fwd,fwd+bwd", help="comma-separated subset of fwd,fwd+bwd")
    parser.add_argument("--warmup-ms", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=50)
    parser.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("benchmarks/gpu/attention_speed.py: no CUDA device; this benchmark only runs on a GPU.", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("benchmarks/gpu/attention_speed.py: TRITON_INTERPRET is set; unset it (or set 0) to time compiled kernels.",
              file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("fwd", "fwd+bwd")]
    if bad:
        parser.error(f"--modes: unknown mode(s) {bad}; use fwd and/or fwd+bwd")
    causal_values = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]

    import triton

    from aiayn.io import atomic_write_text

    device = torch.cuda.get_device_name()
    header = (f"Attention benchmark, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, "
              f"torch {torch.__version__}, triton {triton.__version__}, bf16, B*T={TOTAL_TOKENS}, "
              f"n_heads*head_dim={HIDDEN}; median ms (do_bench, warmup {args.warmup_ms} ms, rep {args.rep_ms} ms); "
              f"fwd+bwd FLOPs = 3.5x fwd.")
    print(header, flush=True)
    print(markdown_table(HEADER, []), flush=True)
    rows: list[Row] = []
    for head_dim in args.head_dims:
        for causal in causal_values:
            for seq_len in args.seq_lens:
                for mode in modes:
                    ms: dict[str, float] = {}
                    tflops: dict[str, float] = {}
                    batch = n_heads = 0
                    for provider in PROVIDERS:
                        try:
                            ms[provider], batch, n_heads = time_one(
                                provider, seq_len, head_dim, causal, mode,
                                warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
                        except Exception as e:  # noqa: BLE001 - a backend refusing the shape, OOM, ...
                            print(f"  {provider} seq={seq_len} d={head_dim} causal={causal} {mode} failed: "
                                  f"{type(e).__name__}: {e}", file=sys.stderr)
                            ms[provider] = float("nan")
                        torch.cuda.empty_cache()
                        flops = attention_flops(batch or max(1, TOTAL_TOKENS // seq_len), HIDDEN // head_dim,
                                                seq_len, seq_len, head_dim, causal, mode)
                        tflops[provider] = flops / (ms[provider] * 1e-3) / 1e12
                    max_diff = float("nan")
                    if mode == "fwd":
                        try:
                            max_diff = max_diff_vs_sdpa(seq_len, head_dim, causal)
                        except Exception as e:  # noqa: BLE001
                            print(f"  max-diff check failed: {type(e).__name__}: {e}", file=sys.stderr)
                    rows.append(Row(seq_len, head_dim, causal, mode, batch, n_heads, ms, tflops, max_diff))
                    print(table_row(rows[-1]), flush=True)
                    if args.out:  # rewritten after every row: a time limit still leaves a table
                        atomic_write_text(args.out, header + "\n\n" + format_table(rows) + "\n")
    print()
    print(format_table(rows))
    if args.out:
        print(f"wrote {args.out}")
    bad = [r for r in rows if not r.max_diff <= MAX_DIFF_BF16 and r.mode == "fwd"]
    if bad:
        print(f"WARNING: {len(bad)} row(s) with max |triton - sdpa-flash| > {MAX_DIFF_BF16} (or not computed)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
