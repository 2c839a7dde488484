"""Cost of one drift check (`aiayn monitor --input FILE`) for windows of 200, 2,000 and 20,000 sentences.

    python benchmarks/perf/drift_check_cost.py [--root .] [--rounds 3] [--sizes 200 2000 20000]

Each check is the command a user or the hourly flow runs, as a fresh process (Python start-up,
the Evidently import, loading the model and the reference, describing and embedding the window,
both reports and their HTML), against the project's full training reference; MLflow tracking off
so the numbers are the check's own. Windows are training sentences (seeded samples; the
content does not change the cost). Rounds alternate the sizes; the table gives the median
and range of wall seconds and the peak resident memory of the process (``ru_maxrss`` from
``os.wait4``). Results: docs/results.md, "Drift check cost".
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Spread, alternate, host_line, markdown_table


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
    from aiayn.config.schema import load_params
    from aiayn.data.readers import read_lines

    params = load_params(root / "params.yaml")
    train = read_lines(root / "data" / "multi30k" / f"{params.data.train_split}.{params.data.src_lang}.gz")
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="drift-cost-"))
    files = {}
    for n in args.sizes:
        files[n] = tmp / f"w{n}.txt"
        files[n].write_text("\n".join(train[i] for i in rng.choice(len(train), size=n, replace=n > len(train))) + "\n")
    checks = itertools.count()

    def check(n: int) -> tuple[float, float]:  # (wall s, peak RSS MiB); each check writes its own report folder
        return run_once(root, files[n], tmp / f"out-{n}-{next(checks)}")[:2]

    runs = {n: (lambda n=n: check(n)) for n in args.sizes}
    results = alternate(runs, args.rounds, progress=lambda r, n, got: print(
        f"round {r + 1} window {n}: {got[0]:.1f} s, {got[1]:.0f} MiB", file=sys.stderr, flush=True))
    print(f"reference: {root / 'artifacts/monitor_reference'}; {args.rounds} rounds, sizes alternating")
    print(host_line())
    print(markdown_table(["window (sentences)", "wall s, median (min-max)", "peak RSS MiB, median"],
                         [[f"{n:,}", f"{Spread.of(s for s, _ in results[n]):.1f}",
                           f"{Spread.of(m for _, m in results[n]).median:.0f}"] for n in args.sizes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
