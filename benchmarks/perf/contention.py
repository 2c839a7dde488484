"""Training throughput with 0, 1 and 2 busy neighbour processes, per OpenMP wait policy.

Each cell is a fresh process (the OpenMP runtime reads its wait policy once, at load) running
``--steps`` real ``tiny`` training steps (the first Multi30k batches of ``artifacts/tokenized``,
``max_tokens`` 2048, 2 threads); neighbours are ``python -c "while True: pass"``. Rounds alternate
the policy order; the table gives median target tokens/s, min-max, and the ratio to the idle
median of the default policy. Results: docs/studies/thread-oversubscription.md.

    python benchmarks/perf/contention.py [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks.harness import Spread, alternate, host_line, markdown_table

STEP_RATE = r'''
import sys, torch
from benchmarks.train_steps import run_steps
from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import model_preset
from aiayn.model import Transformer
from aiayn.tokenizer import load_encoded
steps = int(sys.argv[1]); torch.set_num_threads(2)
split = load_encoded("artifacts/tokenized", "train")
order = make_batches(split.src_lengths, split.tgt_lengths, 2048, data_seed=1, epoch=1)
batches = [collate(split, i) for i in order[: steps + 3]]
torch.manual_seed(0); m = Transformer(model_preset("tiny", vocab_size=8000))
opt = torch.optim.Adam(m.parameters(), lr=1e-4)
run_steps(m, batches[:3], opt); seconds, tokens = run_steps(m, batches[3:], opt); print(tokens / seconds)
'''
POLICIES = {"default (spin)": "ACTIVE_UNSET", "PASSIVE (aiayn default)": "PASSIVE"}


def cell(policy: str, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "ACTIVE_UNSET":
        env["OMP_WAIT_POLICY"] = policy
    # torch is imported before aiayn inside STEP_RATE, so aiayn's own default does not apply
    code = "import torch\n" + STEP_RATE
    out = subprocess.run([sys.executable, "-c", code, str(steps)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rates: dict[tuple[int, str], list[float]] = {}
    for neighbours in (0, 1, 2):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(neighbours)]
        try:
            time.sleep(1)
            got = alternate({name: (lambda name=name: cell(POLICIES[name], args.steps)) for name in POLICIES},
                            args.rounds)
            rates |= {(neighbours, name): v for name, v in got.items()}
        finally:
            for p in procs:
                p.kill()
    idle = Spread.of(rates[(0, "default (spin)")]).median
    print(f"{args.steps} steps x {args.rounds} rounds, tiny, 2 threads, {os.cpu_count()} CPUs")
    print(host_line())
    print()
    spreads = {key: Spread.of(v) for key, v in rates.items()}
    print(markdown_table(["neighbours", "policy", "target tok/s (median)", "min-max", "vs idle default"],
                         [[n, name, f"{s.median:.0f}", f"{s.low:.0f}-{s.high:.0f}", f"{s.median / idle:.2f}"]
                          for (n, name), s in spreads.items()], "llrlr"))


if __name__ == "__main__":
    main()
