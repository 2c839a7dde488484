"""Training speed of a config vs the main job's, in alternating rounds, and the projected wall time of its run.

Runs ``aiayn.train.train`` (the real loop) for ``--steps`` updates of each config on the same encoded data
(``--tokenized``, e.g. ``artifacts/tokenized``), validation and checkpoints pushed past the run, rounds
alternating so machine noise hits both alike. Prints target tokens/s, seconds per update, the ratio to the
main job, the updates per epoch, and the projected training time of ``max_steps`` updates: measured here,
and scaled to the main job's measured speeds on two hosts (``--host-tok-s``: 3064 = an AMD EPYC, 1300 = the
slowest host seen). Prints its figures only (no docs/ section holds them now); the study it sized:
docs/studies/wu2021.md.

    python benchmarks/perf/wu2021_throughput.py [--config configs/multi30k_wu2021.yaml] [--main params.yaml]
        [--tokenized artifacts/tokenized] [--steps 30] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from aiayn.data.batching import make_batches
from aiayn.config.schema import load_params
from aiayn.tokenizer import Tokenizer, load_encoded
from aiayn.train import train
from benchmarks.harness import Spread, alternate, host_line


def timed_run(params, split, steps: int) -> tuple[float, int]:
    """(seconds, target tokens) of ``steps`` updates of ``params.train`` from scratch (no validation, no checkpoint,
    no early stopping: the config's per-epoch validation and patience are switched off for the timing)."""
    cfg = params.train.model_copy(update={"max_steps": steps, "validate_every": 10**9, "checkpoint_every": 10**9,
                                          "max_time_s": None, "log_every": 10**9, "epoch_checkpoints": False,
                                          "early_stop": params.train.early_stop.model_copy(update={"metric": None}),
                                          "valid_bleu": params.train.valid_bleu.model_copy(update={"enabled": False})})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = train(params.model, cfg, split, None, tmp, resume=False)
        return time.perf_counter() - t0, res.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=Path("configs/multi30k_wu2021.yaml"))
    ap.add_argument("--main", type=Path, default=Path("params.yaml"))
    ap.add_argument("--tokenized", type=Path, default=Path("artifacts/tokenized"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--host-tok-s", default="3064,1300", help="main-job target tokens/s of hosts to project onto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocab = Tokenizer.load(args.tokenized / "spm.model").vocab_size
    split = load_encoded(args.tokenized, "train", vocab_size=vocab)
    runs = {}
    for name, path in (("main", args.main), ("config", args.config)):
        p = load_params(path)
        runs[name] = p.model_copy(update={"model": p.model.model_copy(update={"vocab_size": vocab})})
    timed = alternate({name: (lambda name=name: timed_run(runs[name], split, args.steps)) for name in ("main", "config")},
                      args.rounds, progress=lambda r, name, got: print(
                          f"round {r + 1} {name}: {got[1] / got[0]:.0f} target tok/s, {got[0] / args.steps:.3f} s/update"))
    cfg = runs["config"].train
    per_epoch = len(make_batches(split.src_lengths, split.tgt_lengths, cfg.max_tokens, data_seed=cfg.data_seed, epoch=1))
    med = {k: Spread.of(tokens / seconds for seconds, tokens in v).median for k, v in timed.items()}
    spu = Spread.of(seconds / args.steps for seconds, _ in timed["config"]).median
    print(f"\n{host_line()}")
    ratio = med["config"] / med["main"]
    print(f"{args.config}: {med['config']:.0f} target tok/s ({ratio:.2f}x the main job's {med['main']:.0f} here), "
          f"{spu:.3f} s/update, {per_epoch} batches = {per_epoch / cfg.grad_accum:.1f} updates per epoch")
    print(f"projected {cfg.max_steps} updates here: {cfg.max_steps * spu / 3600:.2f} h (+ validations)")
    for host in (float(x) for x in args.host_tok_s.split(",")):
        print(f"  on a host where the main job runs {host:.0f} tok/s: "
              f"{cfg.max_steps * spu * med['main'] / host / 3600:.2f} h")


if __name__ == "__main__":
    main()
