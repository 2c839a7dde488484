"""What validation BLEU costs during training: seconds per validation, greedy vs beam, sample vs whole split.

Decodes the validation split of a trained model folder (``model.json``, ``model.safetensors``, ``spm.model``)
with ``aiayn.train.validation.BleuValidator`` (the code the trainer runs) and times the validation loss next
to it. The share of training time follows from the main job's validations (``max_steps / validate_every``)
and its training seconds. Prints its tables only (no docs/ section holds them now); the knob it prices:
docs/training.md (``train.valid_bleu``).

    python benchmarks/perf/valid_bleu_cost.py --model artifacts/model --prepared artifacts/prepared \\
        --tokenized artifacts/tokenized [--sizes 250,500,1014] [--beams 1,4] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from aiayn.inference.artifacts import ModelBundle
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import DecodeOptions
from aiayn.tokenizer import load_encoded
from aiayn.train import validation_loss
from aiayn.train.validation import BleuValidator
from benchmarks.harness import host_line, markdown_row, markdown_table


def seconds_per_step(model: torch.nn.Module, args: argparse.Namespace) -> float:
    """Median seconds of one training update (forward, backward, Adam) on real training batches, on a copy."""
    import copy
    import statistics

    from aiayn.data.batching import collate, make_batches
    from aiayn.train import label_smoothed_cross_entropy

    train_split = load_encoded(args.tokenized, "train", vocab_size=model.cfg.vocab_size)
    batches = make_batches(train_split.src_lengths, train_split.tgt_lengths, args.max_tokens, data_seed=1, epoch=1)
    m = copy.deepcopy(model).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    times = []
    for idx in batches[: args.train_steps]:
        b = collate(train_split, idx)
        t0 = time.perf_counter()
        loss, _, n = label_smoothed_cross_entropy(m(b.src, b.tgt_in), b.tgt_out, label_smoothing=0.1)
        (loss / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("artifacts/model"))
    ap.add_argument("--prepared", type=Path, default=Path("artifacts/prepared"))
    ap.add_argument("--tokenized", type=Path, default=Path("artifacts/tokenized"))
    ap.add_argument("--split", default="val")
    ap.add_argument("--sizes", default="250,500,1014")
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=20, help="training steps timed for the ratio (0: none)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="training batch size (the main job's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bundle = ModelBundle.load(args.model, device="cpu")
    model = bundle.model.train()  # as the trainer hands it over
    src = read_lines(args.prepared / f"{args.split}.en")
    ref = read_lines(args.prepared / f"{args.split}.de")
    enc = load_encoded(args.tokenized, args.split, vocab_size=bundle.tokenizer.vocab_size)
    t0 = time.perf_counter()
    loss = validation_loss(model, enc, max_tokens=2048, label_smoothing=0.1)
    print(f"validation loss over {len(enc)} pairs: {time.perf_counter() - t0:.1f} s ({loss['valid_loss']:.4f})")
    step_s = seconds_per_step(model, args) if args.train_steps else None
    if step_s:
        print(f"training step (max_tokens {args.max_tokens}): {step_s:.3f} s")
    print(host_line())
    print(markdown_table(["sentences", "beam", "seconds (best of repeats)", "= training steps", "BLEU", "chrF"], [],
                         "rrrrrr"))
    for beam in (int(b) for b in args.beams.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            v = BleuValidator(bundle.tokenizer, src, ref, DecodeOptions(beam_size=beam), size=size, seed=0)
            times, m = [], {}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                m = v(model)
                times.append(time.perf_counter() - t0)
            steps = f"{min(times) / step_s:.1f}" if step_s else "-"
            print(markdown_row([len(v), beam, f"{min(times):.1f}", steps, f"{m['valid_bleu']:.2f}",
                                f"{m['valid_chrf']:.2f}"]))


if __name__ == "__main__":
    main()
