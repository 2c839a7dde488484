"""Training throughput and memory of the ``base`` preset in bf16: SDPA vs our Triton kernel vs torch.compile.

Usage (CUDA; ``benchmarks/gpu/run_gpu.sh`` runs it; results: docs/results.md, "Triton flash attention on GPU")::

    TRITON_INTERPRET=0 python benchmarks/gpu/gpu_train_throughput.py [--steps 40] [--warmup 10] [--rounds 2] [--out FILE]

Each side runs ``aiayn.train.train`` (the real loop: collation, warmup schedule, clipping, skip
guard) with ``train.precision: bf16`` on the same synthetic corpus (WMT-like lengths: 5-80
tokens per side, vocabulary 37000, ``max_tokens`` 8192 per batch) for ``--steps`` updates;
tokens/s counts target tokens of the updates after ``--warmup`` (compilation and autotuning
excluded), memory is ``torch.cuda.max_memory_allocated``. Sides: ``sdpa`` (PyTorch SDPA),
``triton`` (``aiayn.kernels.flash_attention``), ``sdpa+compile`` (``train.compile``). Rounds
alternate the order; the table gives medians, min-max and ratios to ``sdpa``.

``--allow-cpu`` runs a tiny model on CPU, only to smoke-test this script (no Triton side).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np
import torch

from aiayn.config.schema import TrainConfig, model_preset
from aiayn.tokenizer import EncodedSplit
from aiayn.train import train
from benchmarks.harness import Spread, alternate, markdown_table


def corpus(n: int, vocab: int, seed: int = 0) -> EncodedSplit:
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, vocab, size=int(rng.integers(5, 81))) for _ in range(n)]
    tgt = [rng.integers(4, vocab, size=max(3, int(len(s) * rng.uniform(0.8, 1.25)))) for s in src]

    def pack(seqs):
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in seqs])
        return np.concatenate(seqs).astype(np.int32), offsets

    (si, so), (ti, to) = pack(src), pack(tgt)
    return EncodedSplit(src_ids=si, src_offsets=so, tgt_ids=ti, tgt_offsets=to)


def run(side: str, args: argparse.Namespace, split: EncodedSplit, cuda: bool) -> dict[str, float]:
    backend = "triton" if side == "triton" else "sdpa"
    preset = "base" if cuda else "tiny"
    model_cfg = model_preset(preset, vocab_size=args.vocab, attention_backend=backend, max_positions=256)
    cfg = TrainConfig(max_steps=args.steps, max_tokens=args.max_tokens, warmup_steps=4000, validate_every=10**9,
                      checkpoint_every=10**9, log_every=10**9, precision="bf16", compile=side.endswith("compile"),
                      device="cuda" if cuda else "cpu")
    marks: dict[int, tuple[float, int]] = {}
    total = [0]

    def on_step(step: int, m: dict[str, float]) -> None:
        if cuda:
            torch.cuda.synchronize()
        total[0] += int(m["tokens"])
        marks[step] = (time.perf_counter(), total[0])

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as ckpt:
        train(model_cfg, cfg, split, None, ckpt, on_step=on_step, resume=False)
    (t0, n0), (t1, n1) = marks[args.warmup], marks[args.steps]
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return {"tokens_per_s": (n1 - n0) / (t1 - t0), "peak_bytes": peak}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=37000)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--sentences", type=int, default=20000)
    ap.add_argument("--sides", default="sdpa,triton,sdpa+compile")
    ap.add_argument("--out", default=None)
    ap.add_argument("--allow-cpu", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("no CUDA device (use --allow-cpu to smoke-test this script)", file=sys.stderr)
        return 2
    sides = args.sides.split(",")
    if not cuda:
        sides = [s for s in sides if s != "triton"]
        args.vocab, args.max_tokens, args.sentences = min(args.vocab, 1000), min(args.max_tokens, 1024), 500
    split = corpus(args.sentences, args.vocab)
    results = alternate({side: (lambda side=side: run(side, args, split, cuda)) for side in sides}, args.rounds,
                        progress=lambda r, side, got: print(f"round {r + 1} {side}: {got}", file=sys.stderr, flush=True))
    device = torch.cuda.get_device_name() if cuda else "cpu (smoke test)"
    ref = Spread.of(x["tokens_per_s"] for x in results[sides[0]]).median
    rows = []
    for side in sides:
        tps = Spread.of(x["tokens_per_s"] for x in results[side])
        rows.append([side, f"{tps.median:.0f}", f"{tps.low:.0f}-{tps.high:.0f}", f"{tps.median / ref:.2f}",
                     f"{max(x['peak_bytes'] for x in results[side]) / 2**30:.2f}"])
    lines = [f"### Training throughput, {'base' if cuda else 'tiny'} preset, bf16 ({device}, "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"`python benchmarks/gpu/gpu_train_throughput.py --steps {args.steps} --warmup {args.warmup} --rounds "
             f"{args.rounds}`: max_tokens {args.max_tokens}, vocabulary {args.vocab}, target tokens/s over updates "
             f"{args.warmup + 1}..{args.steps}.", "",
             markdown_table(["side", "tokens/s median", "min-max", "ratio to sdpa", "peak memory (GiB)"], rows)]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "table": lines}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
