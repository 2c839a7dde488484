"""Training tokens/s: one process vs 2 data-parallel ranks (DDP, FSDP2), the same global updates.

Every side runs the main job's model (``params.yaml``) on its real data order for ``--steps``
optimizer updates of ``grad_accum = 2`` batches (``train.max_tokens`` each), so the work per
update is identical: one process takes both batches (``--threads`` intra-op threads), two
ranks (torchrun, gloo, 1 thread each: torchrun's default) take one each and all-reduce (DDP) or
reduce-scatter/all-gather (FSDP2). Tokens/s counts target tokens of the updates after the
first ``--warmup`` ones (excluded: start-up, allocator warm-up). Rounds alternate the order of
the sides; the table gives each side's median and min-max, and its ratio to one process.
Needs ``artifacts/tokenized`` (``dvc repro tokenize``). Results: docs/results.md, "Data-parallel training on 2
cores".

    python benchmarks/perf/distributed_throughput.py [--steps 30] [--warmup 5] [--rounds 3] [--sides one,ddp,fsdp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.harness import REPO as ROOT
from benchmarks.harness import Spread, alternate, host_line, markdown_table


def worker(args: argparse.Namespace) -> int:
    """One rank (or the single process): train ``--steps`` updates, rank 0 prints the tokens/s as JSON."""
    import torch

    from aiayn.config.schema import load_params
    from aiayn.train.distributed import init_process_group, world_from_env
    from aiayn.tokenizer import Tokenizer, load_encoded
    from aiayn.train import train

    params = load_params(ROOT / args.params)
    tok = ROOT / "artifacts" / "tokenized"
    vocab = Tokenizer.load(tok / "spm.model").vocab_size
    split = load_encoded(tok, params.data.train_split, vocab_size=vocab)
    world = world_from_env()
    init_process_group(world, torch.device("cpu"))
    if not world.distributed:
        torch.set_num_threads(args.threads)
    cfg = params.train.model_copy(update={
        "max_steps": args.steps, "grad_accum": 2, "validate_every": 10**9, "checkpoint_every": 10**9,
        "max_time_s": None, "distributed": args.mode if world.distributed else "none", "nproc_per_node": 1,
        "device": "cpu"})
    marks: dict[int, tuple[float, int]] = {}
    tokens = [0]

    def on_step(step: int, m: dict[str, float]) -> None:
        tokens[0] += int(m["tokens"])
        marks[step] = (time.perf_counter(), tokens[0])

    with tempfile.TemporaryDirectory() as ckpt:
        train(params.model.model_copy(update={"vocab_size": vocab}), cfg, split, None, ckpt, on_step=on_step,
              world=world, resume=False)
    if world.is_main:
        (t0, n0), (t1, n1) = marks[args.warmup], marks[args.steps]
        print(json.dumps({"tokens_per_s": (n1 - n0) / (t1 - t0), "threads": torch.get_num_threads()}), flush=True)
    if world.distributed:
        torch.distributed.destroy_process_group()
    return 0


def run_side(side: str, args: argparse.Namespace) -> float:
    me = [str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps), "--warmup", str(args.warmup),
          "--params", args.params, "--threads", str(args.threads)]
    if side == "one":
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *me, "--mode", side]
    env = {**os.environ, "AIAYN_TRACKING": "off"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sides", default="one,ddp,fsdp")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads of the one process")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="ddp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    sides = args.sides.split(",")
    results = alternate({side: (lambda side=side: run_side(side, args)) for side in sides}, args.rounds,
                        progress=lambda r, side, tps: print(f"round {r + 1} {side}: {tps:.0f} tokens/s",
                                                            file=sys.stderr, flush=True))
    ref = Spread.of(results[sides[0]]).median
    print(f"### Data-parallel training throughput ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)\n\n{host_line()}\n")
    print(f"`python benchmarks/perf/distributed_throughput.py --steps {args.steps} --warmup {args.warmup} "
          f"--rounds {args.rounds} --sides {args.sides}`; target tokens/s over updates {args.warmup + 1}..{args.steps}, "
          f"grad_accum 2 x max_tokens per update on every side.\n")
    rows = []
    for side in sides:
        tps = Spread.of(results[side])
        rows.append([side, f"1 x {args.threads}" if side == "one" else "2 x 1", f"{tps.median:.0f}",
                     f"{tps.low:.0f}-{tps.high:.0f}", f"{tps.median / ref:.2f}"])
    print(markdown_table(["side", "processes x threads", "tokens/s median", "min-max", f"ratio to `{sides[0]}`"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
