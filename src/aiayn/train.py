"""The training loop: label-smoothed loss, the paper's schedule, exact resume.

``train(...)`` is pure core: tensors and files in, files out. Tracking and
progress display arrive as callbacks, so this module imports neither MLflow
nor any orchestration library.

Reproducibility contract (tests/test_train.py pins it, on CPU):

- ``seed`` seeds initialisation and dropout; ``data_seed`` alone fixes the
  batch order (``aiayn.batching``). Two runs with the same seeds, data and
  config produce bitwise-identical weights.
- A checkpoint holds model, optimizer, every RNG state and the iterator
  position; a run stopped after any step (mid-epoch or at an epoch boundary)
  and resumed gives the same weights and per-step losses as an uninterrupted
  run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from aiayn.batching import Batch, EpochBatchIterator, collate, make_batches
from aiayn.checkpoint import (
    TrainState,
    average_checkpoints,
    capture_rng,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from aiayn.config import PAD_ID, ModelConfig, TrainConfig
from aiayn.model import Transformer
from aiayn.tokenizer import EncodedSplit

__all__ = [
    "label_smoothed_cross_entropy",
    "inverse_sqrt_lr",
    "TrainResult",
    "train",
    "config_fingerprint",
    "validation_loss",
    "averaged_weights",
    "on_grid",
]

log = logging.getLogger("aiayn")

MetricsFn = Callable[[dict[str, float], int], None]


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, label_smoothing: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed cross-entropy over non-pad targets.

    Paper Section 5.4 (label smoothing, Szegedy et al. 2016): the target
    distribution is ``(1 - eps) * onehot + eps / V`` (uniform over the whole
    vocabulary, as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``).

    Args:
        logits: ``(..., V)`` unnormalised scores.
        target: ``(...)`` token ids; ``ignore_index`` positions contribute nothing.

    Returns ``(loss_sum, nll_sum, n_tokens)``: the smoothed loss and the plain
    negative log-likelihood summed over non-pad tokens (nats), and their count.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()  # (N, V)
    flat_target = target.reshape(-1)  # (N,)
    loss = F.cross_entropy(
        flat_logits, flat_target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    nll = F.cross_entropy(flat_logits.detach(), flat_target, ignore_index=ignore_index, reduction="sum")
    return loss, nll, int((flat_target != ignore_index).sum())


def inverse_sqrt_lr(step: int, *, d_model: int, warmup_steps: int, lr_scale: float = 1.0) -> float:
    """Learning rate at optimizer step ``step`` (1-based), paper Section 5.3, eq. (3).

    ``lr = lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``
    """
    step = max(step, 1)
    return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def config_fingerprint(model_cfg: ModelConfig, train_cfg: TrainConfig, data_id: str) -> str:
    """SHA-256 over everything that makes checkpoints of two runs interchangeable.

    Budgets (``max_steps``, ``max_epochs``, ``max_time_s``) and cadence fields are
    excluded: extending a run's budget resumes it rather than restarting.
    """
    budget = {"max_steps", "max_epochs", "max_time_s", "validate_every", "checkpoint_every", "keep_checkpoints",
              "average_last", "log_every", "num_threads", "device"}
    payload = {
        "model": model_cfg.model_dump(mode="json"),
        "train": {k: v for k, v in train_cfg.model_dump(mode="json").items() if k not in budget},
        "data": data_id,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@torch.no_grad()
def validation_loss(model: Transformer, split: EncodedSplit, *, max_tokens: int, label_smoothing: float) -> dict[str, float]:
    """Per-token validation loss and NLL (nats) over ``split``, in eval mode, fixed order.

    Returns ``{"valid_loss", "valid_nll", "valid_ppl"}``. Leaves the model in train mode.
    Does not touch any RNG (dropout is off in eval mode).
    """
    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    for indices in make_batches(split.src_lengths, split.tgt_lengths, max_tokens, data_seed=0, epoch=0):
        b = collate(split, indices)
        device = next(model.parameters()).device
        logits = model(b.src.to(device), b.tgt_in.to(device))
        loss, nll, n = label_smoothed_cross_entropy(logits, b.tgt_out.to(device), label_smoothing=label_smoothing)
        loss_sum += float(loss)
        nll_sum += float(nll)
        n_tokens += n
    model.train()
    nll = nll_sum / max(n_tokens, 1)
    return {"valid_loss": loss_sum / max(n_tokens, 1), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))}


@dataclass
class TrainResult:
    """What a training call did. ``losses`` maps step -> training loss (per token, nats)."""

    step: int
    epoch: int
    losses: dict[int, float] = field(default_factory=dict)
    valid: dict[int, dict[str, float]] = field(default_factory=dict)
    resumed_from: int | None = None
    stopped_by: str = ""
    train_seconds: float = 0.0
    tokens: int = 0
    model: Transformer | None = None
    checkpoints: list[Path] = field(default_factory=list)


class _StopSignal:
    """Turns SIGTERM/SIGINT into a flag so the loop can checkpoint before exiting."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignal":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _next_update(it: EpochBatchIterator, grad_accum: int) -> list[Batch]:
    return [it.next_batch() for _ in range(grad_accum)]


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    train_split: EncodedSplit,
    valid_split: EncodedSplit | None,
    checkpoint_dir: str | Path,
    *,
    data_id: str = "",
    on_metrics: MetricsFn | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train (or resume training) a Transformer; checkpoints go to ``checkpoint_dir``.

    Args:
        model_cfg: architecture; ``vocab_size`` must cover the data's ids.
        train_cfg: optimisation, budgets (``max_steps`` optimizer updates,
            ``max_epochs``, ``max_time_s`` seconds), seeds, checkpoint cadence.
        train_split, valid_split: encoded data (``aiayn.tokenizer.EncodedSplit``).
        checkpoint_dir: where ``ckpt_*`` files are written; a compatible latest
            checkpoint there (same ``config_fingerprint``) is resumed when
            ``resume`` is true; an incompatible one is ignored with a warning.
        data_id: a string identifying the training data (e.g. its hash); part of
            the fingerprint.
        on_metrics: called as ``on_metrics({"loss": ..., "lr": ...}, step)``
            every ``log_every`` steps and after each validation.
        on_step: called after every step with ``(step, {"loss", "lr", "tokens_per_s"})``
            (progress display).

    Returns ``TrainResult`` with the model (weights of the last step, not averaged).
    Raises ``aiayn.checkpoint.CheckpointError`` on a corrupt checkpoint to resume.
    On SIGTERM/SIGINT the loop writes a checkpoint at the current step and
    returns with ``stopped_by="signal"``.
    """
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    checkpoint_dir = Path(checkpoint_dir)
    fingerprint = config_fingerprint(model_cfg, train_cfg, data_id)

    use_cuda = train_cfg.device == "cuda" or (train_cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg, device=device)
    model.train()
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=inverse_sqrt_lr(1, d_model=model_cfg.d_model, warmup_steps=train_cfg.warmup_steps, lr_scale=train_cfg.lr_scale),
        betas=train_cfg.adam_betas,
        eps=train_cfg.adam_eps,
        weight_decay=train_cfg.weight_decay,
    )
    iterator = EpochBatchIterator(train_split, max_tokens=train_cfg.max_tokens, data_seed=train_cfg.data_seed)
    result = TrainResult(step=0, epoch=1, model=model)

    existing = list_checkpoints(checkpoint_dir) if resume else []
    if existing:
        state = load_checkpoint(existing[-1])
        if state.fingerprint != fingerprint:
            log.warning(
                "checkpoints in %s come from a different config or data (fingerprint %s.. != %s..); starting fresh",
                checkpoint_dir, state.fingerprint[:12], fingerprint[:12],
            )
            for path in existing:
                path.unlink(missing_ok=True)
                path.with_suffix(".safetensors").unlink(missing_ok=True)
            existing = []
        else:
            seed_then = state.extra.get("seed")
            if seed_then is not None and seed_then != train_cfg.seed:  # cannot happen with equal fingerprints
                log.warning("resuming a run trained with seed %s under seed %s", seed_then, train_cfg.seed)
            model.load_state_dict(state.model)
            optimizer.load_state_dict(state.optimizer)
            iterator.load_state_dict(state.iterator)
            restore_rng(state.rng)
            result.step = result.resumed_from = state.step
            result.losses = {int(k): v for k, v in state.extra.get("losses", {}).items()}
            log.info("resumed from %s (step %d, epoch %d)", existing[-1].name, state.step, iterator.epoch)

    def checkpoint() -> None:
        path = save_checkpoint(
            checkpoint_dir,
            TrainState(
                step=result.step,
                model=model.state_dict(),
                optimizer=optimizer.state_dict(),
                iterator=iterator.state_dict(),
                rng=capture_rng(),
                fingerprint=fingerprint,
                extra={"seed": train_cfg.seed, "data_seed": train_cfg.data_seed,
                       "losses": {str(k): v for k, v in result.losses.items()}},
            ),
        )
        all_ckpts = list_checkpoints(checkpoint_dir)
        keep = set(on_grid(all_ckpts, train_cfg.checkpoint_every)[-train_cfg.keep_checkpoints:]) | {all_ckpts[-1]}
        for old in all_ckpts:
            if old not in keep:
                old.with_suffix(".safetensors").unlink(missing_ok=True)
                old.unlink(missing_ok=True)
        result.checkpoints.append(path)

    start = time.perf_counter()
    window_tokens, window_start = 0, time.perf_counter()
    with _StopSignal() as stop:
        while True:
            if result.step >= train_cfg.max_steps:
                result.stopped_by = "max_steps"
                break
            if train_cfg.max_epochs is not None and iterator.epoch >= train_cfg.max_epochs and iterator.end_of_epoch:
                result.stopped_by = "max_epochs"
                break
            if train_cfg.max_time_s is not None and time.perf_counter() - start >= train_cfg.max_time_s:
                result.stopped_by = "max_time_s"
                break
            if stop.received is not None:
                result.stopped_by = "signal"
                break

            batches = _next_update(iterator, train_cfg.grad_accum)
            n_tgt = sum(b.n_tgt_tokens for b in batches)
            lr = inverse_sqrt_lr(result.step + 1, d_model=model_cfg.d_model, warmup_steps=train_cfg.warmup_steps,
                                 lr_scale=train_cfg.lr_scale)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss_total = 0.0
            for b in batches:
                logits = model(b.src.to(device), b.tgt_in.to(device))  # (B, T, V)
                loss, _, _ = label_smoothed_cross_entropy(logits, b.tgt_out.to(device),
                                                          label_smoothing=train_cfg.label_smoothing)
                (loss / n_tgt).backward()
                loss_total += float(loss.detach())
            max_norm = train_cfg.clip_norm if train_cfg.clip_norm is not None else math.inf  # inf: measure only
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            optimizer.step()
            result.step += 1
            result.epoch = iterator.epoch
            step_loss = loss_total / n_tgt
            result.losses[result.step] = step_loss
            result.tokens += n_tgt
            window_tokens += n_tgt
            now = time.perf_counter()
            tokens_per_s = window_tokens / max(now - window_start, 1e-9)
            if on_step:
                on_step(result.step, {"loss": step_loss, "lr": lr, "tokens_per_s": tokens_per_s, "epoch": iterator.epoch})
            if not math.isfinite(step_loss):
                raise FloatingPointError(f"training loss is {step_loss} at step {result.step}; lower lr_scale or check the data")
            if on_metrics and result.step % train_cfg.log_every == 0:
                on_metrics({"loss": step_loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                            "epoch": float(iterator.epoch)}, result.step)
                window_tokens, window_start = 0, now
            if valid_split is not None and result.step % train_cfg.validate_every == 0:
                metrics = validation_loss(model, valid_split, max_tokens=train_cfg.max_tokens,
                                          label_smoothing=train_cfg.label_smoothing)
                result.valid[result.step] = metrics
                log.info("step %d: %s", result.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
                if on_metrics:
                    on_metrics(metrics, result.step)
            if result.step % train_cfg.checkpoint_every == 0:
                checkpoint()
    latest = list_checkpoints(checkpoint_dir)
    if not latest or _checkpoint_step(latest[-1]) != result.step:
        checkpoint()
    result.train_seconds = time.perf_counter() - start
    result.epoch = iterator.epoch
    return result


def _checkpoint_step(json_path: Path) -> int:
    return int(json_path.stem.split("_")[1])


def on_grid(paths: list[Path], every: int) -> list[Path]:
    """The checkpoints among ``paths`` written on the ``every``-step grid (steps ``every, 2*every, ...``)."""
    return [p for p in paths if _checkpoint_step(p) % every == 0]


def averaged_weights(checkpoint_dir: str | Path, last: int, *, every: int | None = None) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Average the model weights of the ``last`` newest evenly spaced checkpoints (paper Section 6.1).

    The paper averages checkpoints "written at 10-minute intervals": with ``every``
    (``train.checkpoint_every``) only checkpoints on that step grid are averaged, so a
    run that stopped off the grid (a signal, ``max_time_s``) averages e.g. steps
    1000..1800 rather than 1600, 1800, 1801. When no checkpoint is on the grid (a run
    shorter than ``every``), the newest one alone is used.

    Returns ``(weights, steps_averaged)``. Raises ``CheckpointError`` if there is none.
    """
    paths = list_checkpoints(checkpoint_dir)
    if every is not None:
        paths = on_grid(paths, every) or paths[-1:]
    paths = paths[-last:]
    steps = [_checkpoint_step(p) for p in paths]
    return average_checkpoints(paths), steps
