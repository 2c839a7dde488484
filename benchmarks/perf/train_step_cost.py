"""What a training step costs, per sentence and per target token, for tokenizers, batch sizes, model fields and
the two loss paths, in one process and alternating rounds (like with like).

Each variant is ``NAME:MAX_TOKENS[:key=value...]``; keys: ``tok=DIR`` (a tokenized folder, its vocabulary;
default ``--tokenized``), ``chunk=N`` (the fused loss with ``loss_chunk_tokens`` N; 0 or absent: the plain
logits path), ``compile=1`` (``torch.compile(model.forward, dynamic=True)``, as ``train.compile`` does; its
compilation happens in the warm-up, outside the timing, and is printed), ``old=1`` (the step before the cheaper
CPU step of docs/studies/job-sizing.md: ``torch.nn.Dropout``, rotary positions in their real form, Adam's per-tensor loop;
otherwise the trainer's: ``aiayn.model.dropout``, one complex multiply, ``fused=True``), ``optimizer=muon`` (the
trainer's ``train.optimizer: muon``, ``aiayn.train.optim``; default ``adam``), and any ``ModelConfig``
field of the ``tiny`` preset (``norm=pre``, ``d_model=128``, ...).
Each round runs every variant over ~30k target tokens of its own Multi30k batches; the table gives medians
and min-max; results: docs/results.md, "What the step's parts and settings cost", and the studies that size the
job (docs/studies/job-sizing.md, batch-size.md, rotary-positions.md). The job re-tuned for the slowest host
(docs/studies/job-sizing.md):

    python benchmarks/perf/train_step_cost.py --rounds 5 old:2048:tok=OLD8K/artifacts/tokenized \\
        new_plain:2048:norm=pre new_fused:2048:norm=pre:chunk=512

Muon against Adam (the main job's model, like with like):

    python benchmarks/perf/train_step_cost.py --rounds 7 adam:2048:norm=pre:chunk=512:positions=rope:dropout=0.05 \\
        muon:2048:norm=pre:chunk=512:positions=rope:dropout=0.05:optimizer=muon

The cheaper CPU step (the main job's model, like with like):

    python benchmarks/perf/train_step_cost.py --rounds 7 \\
        before:2048:old=1:norm=pre:chunk=512:positions=rope:dropout=0.05 after:2048:norm=pre:chunk=512:positions=rope:dropout=0.05
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import TrainConfig, model_preset
from aiayn.model import Transformer
from aiayn.model.dropout import Dropout
from aiayn.model.positions import RotaryPositions, rotate_pairs
from aiayn.tokenizer import load_encoded
from aiayn.train.optim import build_optimizer
from benchmarks.harness import Spread, alternate, host_line, markdown_table
from benchmarks.train_steps import run_steps

TOKENS_PER_ROUND = 30_000


def variant(spec: str, default_tok: Path) -> tuple[str, Transformer, list, torch.optim.Optimizer, int]:
    name, max_tokens, *fields = spec.split(":")
    tok, chunk, compiled, old, optimizer, overrides = default_tok, 0, False, False, "adam", {}
    preset = model_preset("tiny")
    for kv in fields:
        key, value = kv.split("=", 1)
        if key == "tok":
            tok = Path(value)
        elif key == "chunk":
            chunk = int(value)
        elif key == "compile":
            compiled = bool(int(value))
        elif key == "old":
            old = bool(int(value))
        elif key == "optimizer":
            optimizer = value
        else:
            current = getattr(preset, key)
            overrides[key] = value if isinstance(current, str) else type(current)(value)
    split = load_encoded(tok, "train")
    vocab = int(max(split.src_ids.max(), split.tgt_ids.max())) + 1
    batches, n = [], 0
    for idx in make_batches(split.src_lengths, split.tgt_lengths, int(max_tokens), data_seed=1, epoch=1):
        batches.append(collate(split, idx))
        n += batches[-1].n_tgt_tokens
        if n > TOKENS_PER_ROUND:
            break
    torch.manual_seed(0)
    model = Transformer(model_preset("tiny", vocab_size=vocab, attention_backend="sdpa", **overrides))
    if old:
        use_old_step(model)
    opt = build_optimizer(model, TrainConfig(optimizer=optimizer), lr=1e-4, fused=not old)
    if compiled:
        model.forward = torch.compile(model.forward, dynamic=True)  # what Trainer does with train.compile
    t0 = time.perf_counter()
    run_steps(model, batches[:3], opt, chunk_tokens=chunk)  # warm-up (and, compiled, the compilation: a new shape may recompile)
    if compiled:
        print(f"{name}: compile + 3 warm-up steps {time.perf_counter() - t0:.1f} s")
    return name, model, batches, opt, chunk


def use_old_step(model: Transformer) -> None:
    """``model`` as it trained before the cheaper CPU step: ``torch.nn.Dropout`` (one Bernoulli draw per
    element) and rotary positions in their real form (two strided halves, four products, a stack)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Dropout):
                setattr(module, name, torch.nn.Dropout(child.p))
        if isinstance(module, RotaryPositions):
            module.rotate = lambda x, start, rope=module: real_rotation(rope, x, start)


def real_rotation(rope: RotaryPositions, x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary positions as they were computed before: the real form (``aiayn.model.positions.rotate_pairs``)."""
    T = x.shape[-2]
    return rotate_pairs(x, rope.cos[start : start + T], rope.sin[start : start + T])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="NAME:MAX_TOKENS[:key=value...]")
    ap.add_argument("--tokenized", type=Path, default=Path("artifacts/tokenized"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(host_line())
    runs = [variant(s, args.tokenized) for s in args.variants]

    def rate(name: str, model: Transformer, batches: list, opt: torch.optim.Optimizer, chunk: int) -> float:
        seconds, tokens = run_steps(model, batches, opt, chunk_tokens=chunk)
        return tokens / seconds

    rates = alternate({r[0]: (lambda r=r: rate(*r)) for r in runs}, args.rounds)
    base = Spread.of(rates[runs[0][0]]).median * len_ratio(runs[0][2])
    rows = []
    for name, model, batches, _, _ in runs:
        tok_s = Spread.of(rates[name])
        sent_s = tok_s.median * len_ratio(batches)
        rows.append([name, f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M", f"{sent_s:.1f}", f"{tok_s:.0f}",
                     f"{sent_s / base:.2f}"])
    print()
    print(markdown_table(["variant", "params", "sentences/s", "target tokens/s (median, min-max)",
                          "sentences/s vs the first"], rows))
    print("\n" + host_line())


def len_ratio(batches: list) -> float:
    """Sentences per target token of ``batches``."""
    return sum(b.src.size(0) for b in batches) / sum(b.n_tgt_tokens for b in batches)


if __name__ == "__main__":
    main()
