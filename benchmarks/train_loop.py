"""The training loop vs the bare model step, same batches, same model, same optimizer settings.

``aiayn.train.train`` does more than a forward/backward/step: it collates each batch from the
encoded split, sets the lr per step (warmup schedule), clips the gradient norm, syncs the loss
for logging, checks the step/time budgets and writes checkpoints. This measures what all that
costs: the same first ``--steps`` batches of the main job's data order through

* **model**: a bare loop over pre-collated batches (forward, label-smoothed loss, backward,
  Adam step), what ``benchmarks/train_throughput.py`` times;
* **loop**: ``aiayn.train.train`` with the main job's ``train`` block (``params.yaml``),
  checkpointing and validation pushed past ``--steps`` unless ``--with-checkpoints``.

Rounds alternate the order (model first, then loop first) so machine noise hits both alike; the
table gives target tokens/s per round, the median ratio loop / model and its min–max.
Needs ``artifacts/tokenized`` (``dvc repro tokenize``).

    python benchmarks/train_loop.py [--steps 30] [--rounds 5] [--params params.yaml] [--with-checkpoints]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import load_params
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer, load_encoded
from aiayn.train import train
from train_throughput import run_steps  # benchmarks/ is on sys.path when run as a script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--tokenized", default="artifacts/tokenized")
    ap.add_argument("--with-checkpoints", action="store_true", help="keep the job's checkpoint/validation cadence")
    args = ap.parse_args(argv)

    if not (Path(args.tokenized) / "spm.model").is_file():
        print(f"{args.tokenized} has no tokenized data: run `dvc repro tokenize` first", file=sys.stderr)
        return 2
    params = load_params(args.params)
    tc = params.train.model_copy(update={"max_steps": args.steps, "max_time_s": None})
    if not args.with_checkpoints:
        tc = tc.model_copy(update={"checkpoint_every": 10**9, "validate_every": 10**9})
    vocab_size = Tokenizer.load(Path(args.tokenized) / "spm.model").vocab_size
    split = load_encoded(args.tokenized, params.data.train_split, vocab_size=vocab_size)
    cfg = params.model.model_copy(update={"vocab_size": vocab_size})  # as the train stage builds it
    order = make_batches(split.src_lengths, split.tgt_lengths, tc.max_tokens, data_seed=tc.data_seed, epoch=1)
    batches = [collate(split, idx) for idx in order[: args.steps]]

    def model_step() -> float:
        torch.manual_seed(tc.seed)
        m = Transformer(cfg)
        opt = torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        seconds, tokens = run_steps(m, batches, opt, label_smoothing=tc.label_smoothing)
        return tokens / seconds

    def loop() -> float:
        with tempfile.TemporaryDirectory() as d:
            r = train(cfg, tc, split, None, d, resume=False)
        assert r.step == args.steps, f"loop stopped at {r.step} ({r.stopped_by})"
        return r.tokens / r.train_seconds

    res: dict[str, list[float]] = {"model": [], "loop": []}
    for i in range(args.rounds):
        pair = [("model", model_step), ("loop", loop)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            res[name].append(fn())
    ratios = [lo / mo for lo, mo in zip(res["loop"], res["model"])]
    print(f"# training loop vs model step — {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.steps} steps of `{args.params}`"
          f"{' with checkpoints' if args.with_checkpoints else ''}\n")
    print("| round | first | model tok/s | loop tok/s | loop / model |\n|---:|---|---:|---:|---:|")
    for i, (mo, lo, r) in enumerate(zip(res["model"], res["loop"], ratios), 1):
        print(f"| {i} | {'model' if i % 2 else 'loop'} | {mo:.0f} | {lo:.0f} | {r:.3f} |")
    print(f"\nmedian loop / model {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
          f"medians {statistics.median(res['model']):.0f} / {statistics.median(res['loop']):.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
