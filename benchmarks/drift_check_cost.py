"""Cost of one drift check (`aiayn monitor --input FILE`) for windows of 200, 2,000 and 20,000 sentences.

    python benchmarks/drift_check_cost.py [--root .] [--rounds 3] [--sizes 200 2000 20000]

Each check is the command a user or the hourly flow runs, as a fresh process (Python start-up,
the Evidently import, loading the model and the reference, describing and embedding the window,
both reports and their HTML), against the project's full training reference; MLflow tracking off
so the numbers are the check's own. Windows are training sentences (seeded samples; the
content does not change the cost). Rounds alternate the sizes; the table gives the median
and range of wall seconds and the peak resident memory of the process (``ru_maxrss`` from
``os.wait4``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def run_once(root: Path, window: Path, out: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit status) of one `aiayn monitor` process."""
    aiayn = Path(sys.executable).parent / "aiayn"
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(aiayn), "monitor", "--input", str(window), "--no-track", "--out", str(out),
                             "--root", str(root), "--params", str(root / "params.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"aiayn monitor exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, proc.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    sys.path[:0] = [str(root), str(root / "tests")]  # the project's packages; tests/support (drift inputs)
    from aiayn.config.schema import load_params
    from support.drift_inputs import read_split

    params = load_params(root / "params.yaml")
    train = read_split(root / "data" / "multi30k", params.data.train_split, params.data.src_lang)
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="drift-cost-"))
    files = {}
    for n in args.sizes:
        files[n] = tmp / f"w{n}.txt"
        files[n].write_text("\n".join(train[i] for i in rng.choice(len(train), size=n, replace=n > len(train))) + "\n")
    results: dict[int, list[tuple[float, float]]] = {n: [] for n in args.sizes}
    for r in range(args.rounds):
        for n in (args.sizes if r % 2 == 0 else list(reversed(args.sizes))):
            seconds, rss, _ = run_once(root, files[n], tmp / f"out-{n}-{r}")
            results[n].append((seconds, rss))
            print(f"round {r + 1} window {n}: {seconds:.1f} s, {rss:.0f} MiB", file=sys.stderr, flush=True)
    print(f"reference: {root / 'artifacts/monitor_reference'}; {args.rounds} rounds, sizes alternating")
    print("| window (sentences) | wall s, median (min-max) | peak RSS MiB, median |")
    print("|---|---|---|")
    for n in args.sizes:
        secs = [s for s, _ in results[n]]
        print(f"| {n:,} | {statistics.median(secs):.1f} ({min(secs):.1f}-{max(secs):.1f}) | "
              f"{statistics.median(m for _, m in results[n]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
