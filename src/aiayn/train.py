"""The training loop: label-smoothed loss, the paper's schedule, exact resume.

``train(...)`` is pure core: tensors and files in, files out. Tracking and
progress display arrive as callbacks, so this module imports neither MLflow
nor any orchestration library.

Reproducibility contract (tests/test_train.py pins it, on CPU):

- ``seed`` seeds initialisation and dropout (reseeded per global batch,
  ``dropout_seed``); ``data_seed`` alone fixes the batch order
  (``aiayn.batching``). Two runs with the same seeds, data and config produce
  bitwise-identical weights.
- N data-parallel ranks (``train.distributed: ddp``) compute the same updates as
  one process with the same ``grad_accum`` (to fp32 summation order), and a
  checkpoint resumes on any world size.
- A checkpoint holds model, optimizer, every RNG state and the iterator
  position; a run stopped after any step (mid-epoch or at an epoch boundary)
  and resumed gives the same weights and per-step losses as an uninterrupted
  run.
"""

from __future__ import annotations

import contextlib
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

import numpy as np
import torch
import torch.nn.functional as F

from aiayn.batching import EpochBatchIterator, collate, make_batches
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
from aiayn.distributed import World, agree, all_reduce_sum, barrier, full_state, load_full_optimizer_state, shard_fsdp
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
    "dropout_seed",
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
    # at least float32 (bf16/fp16 autocast logits are widened; float64 stays float64)
    flat_logits = logits.reshape(-1, logits.size(-1))  # (N, V)
    flat_logits = flat_logits.to(torch.promote_types(flat_logits.dtype, torch.float32))
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
              "average_last", "log_every", "num_threads", "device",
              "distributed", "nproc_per_node", "compile", "max_skipped_updates"}
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
    skipped_updates: int = 0  # updates skipped for a non-finite loss or gradient


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


def dropout_seed(seed: int, step: int, batch: int) -> int:
    """The RNG seed of global batch ``batch`` (0-based) of optimizer update ``step`` (1-based).

    Dropout masks are drawn from ``torch.manual_seed(dropout_seed(...))`` set before each
    batch's forward pass, so they are a pure function of ``(seed, step, batch)``: the same on
    any rank and any world size (fairseq reseeds per update for the same reason). Returns an
    int in ``[0, 2**63)``.
    """
    words = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, int(step), int(batch)]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


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
    world: World | None = None,
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
            every ``log_every`` steps and after each validation (rank 0 only).
        on_step: called after every step with ``(step, {"loss", "lr", "tokens_per_s", "epoch",
            "tokens", "grad_norm"})`` (progress display; rank 0 only); ``tokens`` is the update's
            global target token count, ``grad_norm`` the global gradient L2 norm before clipping.
        world: this process's place in a ``torch.distributed`` job (``aiayn.distributed``;
            the process group must be initialised); default: one process.

    Data parallelism is world-size invariant: an update is ``grad_accum`` consecutive
    batches of the one global order (``aiayn.batching``), rank ``r`` of ``N`` takes batches
    ``r, r+N, ...`` of it, and each batch's loss is divided by the update's global target
    token count (known on every rank from the batch lengths) and multiplied by ``N``
    (DDP averages gradients over ranks). Dropout is reseeded per global batch
    (``dropout_seed``). So N ranks compute the update of one process with the same
    ``grad_accum``, up to fp32 summation order, and a checkpoint resumes on any world size.
    Rank 0 validates and writes checkpoints; stop decisions (signal, clock) are agreed
    by all ranks every step.

    Returns ``TrainResult`` with the model (weights of the last step, not averaged).
    Raises ``aiayn.checkpoint.CheckpointError`` on a corrupt checkpoint to resume,
    ``ValueError`` if ``grad_accum`` is not a multiple of the world size or fp16 is asked
    for on CPU, and ``FloatingPointError`` after more than ``max_skipped_updates``
    consecutive updates with a non-finite gradient (each one is skipped and counted).
    On SIGTERM/SIGINT the loop writes a checkpoint at the current step and
    returns with ``stopped_by="signal"``.
    """
    world = world or World()
    if train_cfg.grad_accum % world.world_size:
        raise ValueError(f"train.grad_accum={train_cfg.grad_accum} is not a multiple of the world size "
                         f"{world.world_size}: an update is grad_accum batches over all ranks together")
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    checkpoint_dir = Path(checkpoint_dir)
    fingerprint = config_fingerprint(model_cfg, train_cfg, data_id)

    use_cuda = train_cfg.device == "cuda" or (train_cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", world.local_rank) if use_cuda else torch.device("cpu")
    if train_cfg.precision == "fp16" and not use_cuda:
        raise ValueError("train.precision=fp16 needs CUDA (use bf16 or fp32 on CPU)")
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg, device=device)
    model.train()
    mode = (train_cfg.distributed if train_cfg.distributed != "none" else "ddp") if world.distributed else "none"
    scaler = torch.amp.GradScaler("cuda") if train_cfg.precision == "fp16" else None
    iterator = EpochBatchIterator(train_split, max_tokens=train_cfg.max_tokens, data_seed=train_cfg.data_seed)
    result = TrainResult(step=0, epoch=1, model=model)

    existing = list_checkpoints(checkpoint_dir) if resume else []
    state = load_checkpoint(existing[-1]) if existing else None
    if state is not None and state.fingerprint != fingerprint:
        log.warning(
            "checkpoints in %s come from a different config or data (fingerprint %s.. != %s..); starting fresh",
            checkpoint_dir, state.fingerprint[:12], fingerprint[:12],
        )
        if world.is_main:
            for path in existing:
                path.unlink(missing_ok=True)
                path.with_suffix(".safetensors").unlink(missing_ok=True)
        state = None
    if state is not None:
        model.load_state_dict(state.model)  # before sharding: every rank holds the full weights
    param_names = [name for name, _ in model.named_parameters()]  # the optimizer's parameter order

    forward: Any = model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Buffers (sinusoid tables) are deterministic: no per-forward broadcast.
        forward = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None,
                                          forward_sync_buffers=False)
    elif mode == "fsdp":
        shard_fsdp(model, world, device)  # in place: parameters become DTensor shards
    if train_cfg.compile:
        forward = torch.compile(forward, dynamic=True)  # batches vary in shape: one graph, not one per shape
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=inverse_sqrt_lr(1, d_model=model_cfg.d_model, warmup_steps=train_cfg.warmup_steps, lr_scale=train_cfg.lr_scale),
        betas=train_cfg.adam_betas,
        eps=train_cfg.adam_eps,
        weight_decay=train_cfg.weight_decay,
    )
    if state is not None:
        seed_then = state.extra.get("seed")
        if seed_then is not None and seed_then != train_cfg.seed:  # cannot happen with equal fingerprints
            log.warning("resuming a run trained with seed %s under seed %s", seed_then, train_cfg.seed)
        if mode == "fsdp":
            load_full_optimizer_state(model, optimizer, state.optimizer, param_names)
        else:
            optimizer.load_state_dict(state.optimizer)
        iterator.load_state_dict(state.iterator)
        restore_rng(state.rng)
        if scaler is not None and "grad_scaler" in state.extra:
            scaler.load_state_dict(state.extra["grad_scaler"])
        result.step = result.resumed_from = state.step
        result.losses = {int(k): v for k, v in state.extra.get("losses", {}).items()}
        result.skipped_updates = int(state.extra.get("skipped_updates", 0))
        log.info("resumed from %s (step %d, epoch %d)", existing[-1].name, state.step, iterator.epoch)
    barrier(world)  # nobody trains before rank 0 has cleared foreign checkpoints

    def checkpoint() -> None:
        if mode == "fsdp":  # a collective: every rank gathers, rank 0 gets the full tensors
            model_state, optim_state = full_state(model, optimizer, param_names)
        elif world.is_main:
            model_state, optim_state = model.state_dict(), optimizer.state_dict()
        if not world.is_main:
            return
        path = save_checkpoint(
            checkpoint_dir,
            TrainState(
                step=result.step,
                model=model_state,
                optimizer=optim_state,
                iterator=iterator.state_dict(),
                rng=capture_rng(),
                fingerprint=fingerprint,
                extra={"seed": train_cfg.seed, "data_seed": train_cfg.data_seed, "world_size": world.world_size,
                       "distributed": mode, "skipped_updates": result.skipped_updates,
                       **({"grad_scaler": scaler.state_dict()} if scaler is not None else {}),
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

    mine = range(world.rank, train_cfg.grad_accum, world.world_size)  # this rank's batches of each update
    consecutive_skips = 0
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
            out_of_time, signalled = agree(
                world,
                train_cfg.max_time_s is not None and time.perf_counter() - start >= train_cfg.max_time_s,
                stop.received is not None,
            )
            if out_of_time:
                result.stopped_by = "max_time_s"
                break
            if signalled:
                result.stopped_by = "signal"
                break

            update = [iterator.next_indices() for _ in range(train_cfg.grad_accum)]  # the global update
            n_tgt = sum(iterator.n_tgt_tokens(ix) for ix in update)  # global target tokens, same on every rank
            lr = inverse_sqrt_lr(result.step + 1, d_model=model_cfg.d_model, warmup_steps=train_cfg.warmup_steps,
                                 lr_scale=train_cfg.lr_scale)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss_local = 0.0
            for j, k in enumerate(mine):
                b = collate(train_split, update[k])
                torch.manual_seed(dropout_seed(train_cfg.seed, result.step + 1, k))
                last = j == len(mine) - 1  # gradients are reduced over ranks after the last batch only
                if mode == "fsdp":
                    model.set_requires_gradient_sync(last)
                with (forward.no_sync() if mode == "ddp" and not last else contextlib.nullcontext()):
                    with _autocast(device, train_cfg.precision):
                        logits = forward(b.src.to(device), b.tgt_in.to(device))  # (B, T, V)
                    loss, _, _ = label_smoothed_cross_entropy(logits, b.tgt_out.to(device),
                                                              label_smoothing=train_cfg.label_smoothing)
                    scaled = loss * world.world_size / n_tgt
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                loss_local += float(loss.detach())
            loss_total = all_reduce_sum(world, [loss_local])[0]
            if scaler is not None:
                scaler.unscale_(optimizer)
            max_norm = train_cfg.clip_norm if train_cfg.clip_norm is not None else math.inf  # inf: measure only
            grad_norm = _float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            step_loss = loss_total / n_tgt
            finite = math.isfinite(grad_norm) and math.isfinite(step_loss)
            if scaler is not None:
                scaler.step(optimizer)  # skips the update itself on inf/nan gradients
                scaler.update()
            elif finite:
                optimizer.step()
            result.step += 1
            result.epoch = iterator.epoch
            if finite:
                consecutive_skips = 0
            else:
                result.skipped_updates += 1
                consecutive_skips += 1
                log.warning("step %d: non-finite %s (loss %s, grad norm %s); update skipped (%d in a row, %d in all)",
                            result.step, "gradient" if math.isfinite(step_loss) else "loss", step_loss, grad_norm,
                            consecutive_skips, result.skipped_updates)
                if world.is_main and on_metrics:
                    on_metrics({"skipped_updates": float(result.skipped_updates)}, result.step)
                if consecutive_skips > train_cfg.max_skipped_updates:
                    raise FloatingPointError(
                        f"{consecutive_skips} consecutive updates had a non-finite loss or gradient (step {result.step},"
                        f" loss {step_loss}); lower lr_scale or check the data")
            result.losses[result.step] = step_loss
            result.tokens += n_tgt
            window_tokens += n_tgt
            now = time.perf_counter()
            tokens_per_s = window_tokens / max(now - window_start, 1e-9)
            if on_step and world.is_main:
                on_step(result.step, {"loss": step_loss, "lr": lr, "tokens_per_s": tokens_per_s, "epoch": iterator.epoch,
                                     "tokens": n_tgt, "grad_norm": grad_norm})
            if on_metrics and world.is_main and result.step % train_cfg.log_every == 0:
                on_metrics({"loss": step_loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                            "epoch": float(iterator.epoch)}, result.step)
                window_tokens, window_start = 0, now
            # FSDP gathers parameters inside forward: every rank runs the (identical) validation
            if valid_split is not None and (world.is_main or mode == "fsdp") and result.step % train_cfg.validate_every == 0:
                metrics = validation_loss(model, valid_split, max_tokens=train_cfg.max_tokens,
                                          label_smoothing=train_cfg.label_smoothing)
                result.valid[result.step] = metrics
                if world.is_main:
                    log.info("step %d: %s", result.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
                    if on_metrics:
                        on_metrics(metrics, result.step)
            if result.step % train_cfg.checkpoint_every == 0:
                checkpoint()
    latest = list_checkpoints(checkpoint_dir) if world.is_main else []
    missing = world.is_main and (not latest or _checkpoint_step(latest[-1]) != result.step)
    if agree(world, missing)[0]:  # rank 0 decides; with FSDP every rank takes part in the gather
        checkpoint()
    barrier(world)  # the last checkpoint is on disk before any rank returns
    result.train_seconds = time.perf_counter() - start
    result.epoch = iterator.epoch
    return result


def _float(t: torch.Tensor) -> float:
    """A scalar tensor (or FSDP2's replicated DTensor) as a Python float."""
    return float(t.full_tensor() if hasattr(t, "full_tensor") else t)


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
