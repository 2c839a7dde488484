"""The training loop vs the bare model step, same batches, same model, same optimizer settings.

``aiayn.train.train`` does more than a forward/backward/step: it collates each batch from the
encoded split, sets the lr per step (warmup schedule), clips the gradient norm, syncs the loss
for logging, checks the step/time budgets and writes checkpoints. This measures what all that
costs: the same first ``--steps`` batches of the main job's data order through

* **model**: a bare loop over pre-collated batches (forward, label-smoothed loss, backward,
  Adam step): ``benchmarks/train_steps.py``, what ``perf/train_throughput.py`` times;
* **loop**: ``aiayn.train.train`` with the main job's ``train`` block (``params.yaml``),
  checkpointing and validation pushed past ``--steps`` unless ``--with-checkpoints``.

Rounds alternate the order (model first, then loop first) so machine noise hits both alike; the
table gives target tokens/s per round, the median ratio loop / model and its min–max.
Needs ``artifacts/tokenized`` (``dvc repro tokenize``). Results: docs/results.md, "Against
``torch.nn.Transformer``, and the loop against the bare step".

    python benchmarks/perf/train_loop.py [--steps 30] [--rounds 5] [--params params.yaml] [--with-checkpoints]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import load_params
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer, load_encoded
from aiayn.train import train
from benchmarks.harness import Spread, alternate, host_line, markdown_table, ratios
from benchmarks.train_steps import run_steps


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

    res = alternate({"model": model_step, "loop": loop}, args.rounds)
    loop_vs_model = ratios(res["loop"], res["model"])
    print(f"# training loop vs model step — {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{args.steps} steps of `{args.params}`{' with checkpoints' if args.with_checkpoints else ''}\n")
    print(host_line() + "\n")
    print(markdown_table(["round", "first", "model tok/s", "loop tok/s", "loop / model"],
                         [[i, "model" if i % 2 else "loop", f"{mo:.0f}", f"{lo:.0f}", f"{r:.3f}"]
                          for i, (mo, lo, r) in enumerate(zip(res["model"], res["loop"], loop_vs_model), 1)], "rlrrr"))
    spread = Spread.of(loop_vs_model)
    print(f"\nmedian loop / model {spread.median:.3f} (min {spread.low:.3f}, max {spread.high:.3f}); "
          f"medians {Spread.of(res['model']).median:.0f} / {Spread.of(res['loop']).median:.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
