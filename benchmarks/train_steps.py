"""The bare training step the training benchmarks time: forward, label-smoothed loss, backward, optimizer step.

Shared by ``perf/train_throughput.py`` (aiayn against ``torch.nn.Transformer``), ``perf/train_loop.py`` (the
trainer's loop against this), ``perf/train_step_cost.py`` (settings against each other), ``perf/contention.py``
and ``studies/variants_study.py`` (each variant's step, like for like), so they all time the same work.
"""

from __future__ import annotations

import time

import torch

from aiayn.train import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy


def run_steps(model: torch.nn.Module, batches: list, opt: torch.optim.Optimizer, *, label_smoothing: float = 0.1,
              chunk_tokens: int = 0) -> tuple[float, int]:
    """One pass of the bare step over pre-collated ``batches``: ``(seconds, target tokens)``. ``chunk_tokens``:
    the fused output layer and loss (``train.loss_chunk_tokens``; an aiayn ``Transformer``), 0 the plain logits."""
    model.train()
    tokens = 0
    t0 = time.perf_counter()
    for b in batches:
        opt.zero_grad(set_to_none=True)
        if chunk_tokens:
            loss, _, n = linear_label_smoothed_cross_entropy(
                model(b.src, b.tgt_in, project=False), model.tgt_embed.weight, b.tgt_out,
                label_smoothing=label_smoothing, chunk_tokens=chunk_tokens)
        else:
            loss, _, n = label_smoothed_cross_entropy(model(b.src, b.tgt_in), b.tgt_out, label_smoothing=label_smoothing)
        (loss / n).backward()
        opt.step()
        tokens += b.n_tgt_tokens
    return time.perf_counter() - t0, tokens
