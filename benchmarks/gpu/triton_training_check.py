"""A GPU correctness check, not a benchmark: train the ``tiny`` Transformer with attention backend 'triton' and
'sdpa'; the loss curves must match.

Usage (CUDA; ``benchmarks/gpu/run_gpu.sh`` runs it, its verdict goes to docs/results.md, "Triton flash attention
on GPU")::

    TRITON_INTERPRET=0 python benchmarks/gpu/triton_training_check.py [--steps 300] [--amp bf16] [--out FILE]

Both runs start from the same weights (the triton model loads the sdpa
model's initial state dict), see the same seeded synthetic batches and the
same dropout RNG stream, so the only difference is the attention kernel.

Data: a synthetic "translation" task — the target is a copy of the source
(learnable only through cross-attention) — with source/target lengths drawn uniformly from 5..40 tokens and
right padding, so key-padding masks (encoder self-attention, cross-attention)
and causal decoder self-attention are all exercised. Vocabulary 1000, 64
sentence pairs per batch.

Pass criteria (printed, and the exit status is 1 if any fails):

* step-0 loss difference ``<= 1e-3`` (same weights, same batch: only
  rounding differs);
* ``max |loss_triton - loss_sdpa|`` over all steps ``<= 2e-2`` (fp32) or
  ``<= 5e-2`` (``--amp bf16``: bf16 attention rounds P to 8 bits and the two
  runs drift apart slowly), and the mean ``<= 1e-2``;
* both runs learn: the mean loss of the last 20 steps is at least 1 nat
  below the first step's (uniform guessing over the vocabulary stays near
  ln(1000) = 6.9 nats; a CPU run of the sdpa model fell from 7.37 to 6.45 in
  150 steps of 32 sentences, so 300 steps of 64 leave a wide margin).

Exits with status 2 when there is no CUDA device (``--allow-cpu`` runs it on
CPU under ``TRITON_INTERPRET=1`` with a smaller model, only to smoke-test this
script). ``--out FILE`` writes the per-step losses and the verdict as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, ModelConfig, model_preset

VOCAB_SIZE = 1000
BATCH_SENTENCES = 64
MIN_LEN, MAX_LEN = 5, 40
FIRST_TOKEN = 4  # ids below are PAD/UNK/BOS/EOS
TOLERANCE = {"step0": 1e-3, "max": {"fp32": 2e-2, "bf16": 5e-2}, "mean": 1e-2, "learned_drop": 1.0}


def synthetic_batches(n_steps: int, *, seed: int, batch: int = BATCH_SENTENCES) -> list[tuple[torch.Tensor, ...]]:
    """``n_steps`` batches of ``(src, tgt_in, tgt_out)``, each ``(batch, T)`` long, right-padded with PAD.

    ``tgt_in`` = BOS + src; ``tgt_out`` = src + EOS (a copy task). Pure function of ``seed``.
    """
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_steps):
        lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (batch,), generator=gen)  # (batch,)
        max_len = int(lengths.max())
        src = torch.full((batch, max_len), PAD_ID, dtype=torch.long)  # (batch, S)
        tgt_in = torch.full((batch, max_len + 1), PAD_ID, dtype=torch.long)  # (batch, T)
        tgt_out = torch.full((batch, max_len + 1), PAD_ID, dtype=torch.long)  # (batch, T)
        for i, n in enumerate(lengths.tolist()):
            tokens = torch.randint(FIRST_TOKEN, VOCAB_SIZE, (n,), generator=gen)
            src[i, :n] = tokens
            tgt_in[i, 0] = BOS_ID
            tgt_in[i, 1:n + 1] = tokens
            tgt_out[i, :n] = tokens
            tgt_out[i, n] = EOS_ID
        batches.append((src, tgt_in, tgt_out))
    return batches


def tiny_config(backend: str, *, small: bool) -> ModelConfig:
    """The ``tiny`` preset with this vocabulary and backend (``small``: CPU smoke-test size)."""
    overrides = dict(vocab_size=VOCAB_SIZE, attention_backend=backend)
    if small:
        overrides.update(d_model=64, n_heads=2, d_ff=128, n_layers=1)
    return model_preset("tiny", **overrides)


def train_curve(backend: str, batches, *, device: str, amp: str, seed: int, init_state, small: bool) -> list[float]:
    """Per-step training loss (label-smoothed CE, nats/token) of one run."""
    from aiayn.model import Transformer

    torch.manual_seed(seed)
    model = Transformer(tiny_config(backend, small=small), device=device)
    model.load_state_dict(init_state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    warmup = max(1, len(batches) // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    torch.manual_seed(seed)  # same dropout stream in both runs
    losses = []
    model.train()
    for src, tgt_in, tgt_out in batches:
        src, tgt_in, tgt_out = (t.to(device, non_blocking=True) for t in (src, tgt_in, tgt_out))
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp == "bf16"):
            logits = model(src, tgt_in)  # (B, T, vocab_size)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), tgt_out.reshape(-1),
                               ignore_index=PAD_ID, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--amp", choices=["fp32", "bf16"], default="bf16", help="bf16 = torch.autocast bf16")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="write per-step losses and the verdict (JSON)")
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test on CPU (needs TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        device, small = "cuda", False
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("triton_training_check: TRITON_INTERPRET is set; unset it to run compiled kernels.", file=sys.stderr)
            return 2
    elif args.allow_cpu and os.environ.get("TRITON_INTERPRET") == "1":
        device, small = "cpu", True
    else:
        print("triton_training_check: no CUDA device; this check only runs on a GPU.", file=sys.stderr)
        return 2

    from aiayn.model import Transformer

    batches = synthetic_batches(args.steps, seed=args.seed, batch=BATCH_SENTENCES if not small else 8)
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in Transformer(tiny_config("sdpa", small=small), device=device)
                  .state_dict().items()}

    curves, seconds = {}, {}
    for backend in ("sdpa", "triton"):
        start = time.perf_counter()
        curves[backend] = train_curve(backend, batches, device=device, amp=args.amp, seed=args.seed,
                                      init_state=init_state, small=small)
        seconds[backend] = time.perf_counter() - start
        print(f"{backend}: {args.steps} steps in {seconds[backend]:.1f} s (incl. compile/autotune), "
              f"loss {curves[backend][0]:.4f} -> {curves[backend][-1]:.4f}", flush=True)

    diffs = [abs(a - b) for a, b in zip(curves["triton"], curves["sdpa"])]
    tail = min(20, len(diffs))
    mean_diff = sum(diffs) / len(diffs)
    max_bound = TOLERANCE["max"][args.amp]
    checks = {  # name -> (value, passed, rule)
        "step0_abs_diff": (diffs[0], diffs[0] <= TOLERANCE["step0"], f"<= {TOLERANCE['step0']}"),
        "max_abs_diff": (max(diffs), max(diffs) <= max_bound, f"<= {max_bound}"),
        "mean_abs_diff": (mean_diff, mean_diff <= TOLERANCE["mean"], f"<= {TOLERANCE['mean']}"),
    }
    for backend, curve in curves.items():
        drop = curve[0] - sum(curve[-tail:]) / tail  # nats
        checks[f"{backend}_loss_drop"] = (drop, drop >= TOLERANCE["learned_drop"], f">= {TOLERANCE['learned_drop']}")
    ok = all(passed for _, passed, _ in checks.values())
    for name, (value, passed, rule) in checks.items():
        print(f"  {name}: {value:.4g} (needs {rule}) {'ok' if passed else 'FAIL'}")
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print(f"triton_training_check: {'PASS' if ok else 'FAIL'} on {device_name}, amp={args.amp}, steps={args.steps}")
    if args.out:
        from aiayn.io import atomic_write_json

        atomic_write_json(args.out, {
            "device": device_name, "amp": args.amp, "steps": args.steps, "seed": args.seed, "pass": ok,
            "checks": {k: {"value": v, "pass": p, "rule": r} for k, (v, p, r) in checks.items()},
            "seconds": seconds, "losses": curves,
        })
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
