"""What Muon's step costs on a CPU, and whether its bytes depend on the host: Newton-Schulz in bf16
(``torch.optim.Muon``) under each oneDNN instruction set, against fp32 (``aiayn.train.optim``) per matrix and
batched per shape, then the trainer's loop with Muon against Adam.

    python benchmarks/perf/muon_cost.py [--rounds 5] [--loop-steps 100] [--tokenized artifacts/tokenized]

**Newton-Schulz** (``ns``): the 48 weight matrices of the main job's model (``tiny``: 36 of 256x256, 6 of
1024x256, 6 of 256x1024; seeded Gaussians), 5 iterations each, one fresh process per row so that
``ONEDNN_MAX_CPU_ISA`` takes effect (unset: AMX where the CPU has it; ``AVX512_CORE_BF16``: an AVX-512 BF16
CPU such as AMD Zen 4; ``AVX512_CORE``: an AVX-512 one without BF16). Each row: ms for all 48 (median, min-max of
``--rounds``) and the sha256 of the results (12 hex digits): rows that share it compute the same bytes.

**Loop** (``loop``, needs ``--tokenized``): ``aiayn.train.train`` with the ``train`` block of ``--params``
(2 threads, ``optimizer`` adam then muon, alternating order per round), ``--loop-steps`` updates with warmup 60
and validation off; optimizer updates per second between the first and last log line.
Run it under the train stage's settings (``OMP_WAIT_POLICY=PASSIVE ATEN_CPU_CAPABILITY=avx2`` and, on Intel,
``MKL_CBWR=AVX2``), on an idle machine. Results: docs/results.md, "The main job's step: Adam against Muon", and
docs/studies/muon.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Spread, alternate, host_line, markdown_row, markdown_table

_NS = r"""
import hashlib, statistics, sys, time, torch
from aiayn.train.optim import NS_COEFFICIENTS, orthogonalize
torch.set_num_threads(int(sys.argv[1]))
kind, rounds = sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(0)
mats = [torch.randn(s, generator=g) for s in [(256, 256)] * 36 + [(1024, 256)] * 6 + [(256, 1024)] * 6]
if kind == "bf16":
    from torch.optim._muon import _zeropower_via_newtonschulz as z
    run = lambda: [z(m, NS_COEFFICIENTS, 5, 1e-7).float() for m in mats]
elif kind == "fp32-batched":
    run = lambda: orthogonalize(mats)
else:
    run = lambda: [orthogonalize([m])[0] for m in mats]
digest = hashlib.sha256(b"".join(o.contiguous().numpy().tobytes() for o in run())).hexdigest()[:12]
times = []
for _ in range(rounds):
    t0 = time.perf_counter(); run(); times.append(1000 * (time.perf_counter() - t0))
print(f"{statistics.median(times):.0f} ({min(times):.0f}-{max(times):.0f})", digest)
"""

_ROWS = [("bf16 (torch.optim.Muon)", "bf16", "", 1), ("bf16 (torch.optim.Muon)", "bf16", "AVX512_CORE_BF16", 1),
         ("bf16 (torch.optim.Muon)", "bf16", "AVX512_CORE", 1), ("fp32 per matrix", "fp32", "", 1),
         ("fp32 per matrix", "fp32", "", 2), ("fp32 batched (aiayn)", "fp32-batched", "", 1),
         ("fp32 batched (aiayn)", "fp32-batched", "", 2), ("fp32 batched (aiayn)", "fp32-batched", "AVX2", 2)]


def newton_schulz(rounds: int) -> None:
    print(markdown_table(["Newton-Schulz, 48 matrices", "ONEDNN_MAX_CPU_ISA", "threads", "ms (median, min-max)",
                          "sha256"], []))
    for name, kind, isa, threads in _ROWS:  # one row at a time: each is a fresh process
        env = os.environ | {"ONEDNN_MAX_CPU_ISA": isa}
        out = subprocess.run([sys.executable, "-c", _NS, str(threads), kind, str(rounds)], env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        print(markdown_row([name, isa or "(unset)", threads, f"{out[0]} {out[1]}", out[2]]))


def loop(params: Path, tokenized: Path, steps: int, rounds: int) -> None:
    import sentencepiece as spm

    from aiayn.config.schema import load_params
    from aiayn.tokenizer import load_encoded
    from aiayn.train import train

    p = load_params(params)
    split = load_encoded(tokenized, "train")
    vocab = spm.SentencePieceProcessor(model_file=str(tokenized / "spm.model")).vocab_size()
    model_cfg = p.model.model_copy(update={"vocab_size": vocab})
    def updates_per_s(opt: str) -> float:
        cfg = p.train.model_copy(update={"optimizer": opt, "max_steps": steps, "max_time_s": None,
                                         "warmup_steps": 60, "lr_scale": 1.0, "validate_every": 10**6,
                                         "log_every": 10, "num_threads": 2})
        marks: dict[int, float] = {}
        with tempfile.TemporaryDirectory() as ck:
            train(model_cfg, cfg, split, None, ck, on_metrics=lambda m, s: marks.setdefault(s, time.perf_counter()))
        first, last = sorted(marks)[1], max(marks)  # from the second log line: the first one pays the start
        return (last - first) / (marks[last] - marks[first])

    rates = {name: Spread.of(v) for name, v in alternate({opt: (lambda opt=opt: updates_per_s(opt))
                                                           for opt in ("adam", "muon")}, rounds).items()}
    print()
    print(markdown_table(["trainer loop", "updates/s (median, min-max)", "vs Adam"],
                         [[name, f"{s:.3f}", f"{s.median / rates['adam'].median:.3f}"] for name, s in rates.items()]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loop-steps", type=int, default=100)
    ap.add_argument("--tokenized", type=Path, default=Path("artifacts/tokenized"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--only", choices=["ns", "loop"])
    args = ap.parse_args()
    print(host_line())
    if args.only != "loop":
        newton_schulz(args.rounds)
    if args.only != "ns":
        loop(args.params, args.tokenized, args.loop_steps, max(2, args.rounds // 2))
    print("\n" + host_line())


if __name__ == "__main__":
    main()
