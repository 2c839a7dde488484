"""Do PyTorch's CPU kernels change a training run's bytes on this host? One row per kernel set.

    python benchmarks/repro/isa_bytes.py [--steps 10] [--rounds 2] [--optimizer adam|muon]

Trains a small Transformer (``aiayn.model``: d_model 128, 4 heads, 2+2 layers, dropout 0.1) for
``--steps`` updates of ``--optimizer`` (``aiayn.train.optim``: the paper's Adam, or Muon for the layers'
matrices) on seeded random tokens, 2 threads, in a fresh process per row and round,
with ``ATEN_CPU_CAPABILITY`` unset (PyTorch's own choice for this CPU), ``avx2`` and, where the CPU
has AVX-512, ``avx512``. Prints the kernels each process ran, the last loss, the sha256 of the weights
(first 16 hex digits) and the seconds of the training loop (median over rounds, min-max). Rows that share a hash compute the same bytes; rounds
repeat each row to show a row is deterministic. ``aiayn`` pins ``avx2`` wherever the CPU has it
(``aiayn.config.settings.CPU_CAPABILITY_DEFAULT``), so AVX2 and AVX-512 hosts train the same bytes. Results:
docs/studies/same-bytes-per-host-class.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from benchmarks.harness import Spread, markdown_table

_TRAIN = r"""
import hashlib, sys, time, torch
from aiayn.config.schema import ModelConfig, TrainConfig
from aiayn.model.transformer import Transformer
from aiayn.train.optim import build_optimizer
steps = int(sys.argv[1])
torch.set_num_threads(2)
torch.manual_seed(0)
model = Transformer(ModelConfig(vocab_size=1000, d_model=128, n_heads=4, d_ff=256, n_layers=2, dropout=0.1))
if sys.argv[2] == "adam":
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
else:
    opt = build_optimizer(model, TrainConfig(optimizer=sys.argv[2]), lr=1e-3, fused=True)
g = torch.Generator().manual_seed(1)
t0 = time.perf_counter()
for _ in range(steps):
    src, tgt = torch.randint(4, 1000, (16, 30), generator=g), torch.randint(4, 1000, (16, 31), generator=g)
    logits = model(src, tgt[:, :-1])  # (16, 30, 1000)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), tgt[:, 1:].reshape(-1), label_smoothing=0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
seconds = time.perf_counter() - t0
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(torch.backends.cpu.get_cpu_capability(), f"{loss.item():.7f}", digest[:16], f"{seconds:.3f}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="updates per run (default 10)")
    ap.add_argument("--optimizer", choices=["adam", "muon"], default="adam", help="train.optimizer (default adam)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each row, alternating (default 2)")
    args = ap.parse_args()
    from aiayn.host import host_info

    info = host_info()
    rows = [None, "avx2"] + (["avx512"] if "avx512f" in info.isa else [])
    results: dict[str | None, list[tuple[str, str, str, float]]] = {row: [] for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
            if row:
                env["ATEN_CPU_CAPABILITY"] = row
            out = subprocess.run([sys.executable, "-c", _TRAIN, str(args.steps), args.optimizer], env=env, capture_output=True,
                                 text=True, check=True).stdout.split()
            results[row].append((out[-4], out[-3], out[-2], float(out[-1])))
    print(f"{args.steps} {args.optimizer} steps, 2 threads, seeded; one fresh process per run\n")
    table = []
    for row, runs in results.items():
        kernels, loss, digest, _ = runs[0]
        agree = "yes" if len({r[2] for r in runs}) == 1 else "**no**"
        table.append([row or "unset (PyTorch picks)", kernels, loss, digest, agree, f"{Spread.of(r[3] for r in runs):.2f}"])
    print(markdown_table(["ATEN_CPU_CAPABILITY", "kernels run", "last loss", "sha256 of the weights", "runs agree",
                          "training s (median, min-max)"], table, "llrllr"))
    print(f"\n{info.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
