"""The training loop as a ``Trainer``: set up (model, optimizer, exact resume), then update until a budget or a signal.

Shaped like a torchtune recipe: ``setup()`` builds the run through small ``_setup_*``
steps, ``train()`` is the loop over ``should_stop()`` and ``step()``, and ``checkpoint()``
writes the full training state. ``train(...)`` wraps the three calls; the contract
(determinism, world-size invariance, resume) is in the package docstring (``aiayn.train``).
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

import torch

from aiayn.data.batching import EpochBatchIterator, collate
from aiayn.checkpoint import (
    TrainState,
    capture_rng,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from aiayn.config.schema import ModelConfig, TrainConfig
from aiayn.train.distributed import (
    World,
    agree,
    all_reduce_sum,
    barrier,
    full_state,
    load_full_optimizer_state,
    rank_device,
    shard_fsdp,
)
from aiayn.model import Transformer
from aiayn.tokenizer import EncodedSplit
from aiayn.train.early_stop import EarlyStopper, higher_is_better
from aiayn.train.loss import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy, validation_loss
from aiayn.train.optim import build_optimizer
from aiayn.train.schedule import dropout_seed, lr_schedule

__all__ = ["TrainResult", "Trainer", "train", "config_fingerprint"]

log = logging.getLogger("aiayn")

MetricsFn = Callable[[dict[str, float], int], None]
StepFn = Callable[[int, dict[str, float]], None]
#: Extra validation metrics of a model (e.g. ``aiayn.train.validation.BleuValidator``): no RNG, any mode in, same mode out.
ScorerFn = Callable[[torch.nn.Module], dict[str, float]]


#: The training step's arithmetic: a checkpoint written under another one starts a fresh run (its weights
#: would mix two float orders). 2: ``aiayn.model.dropout``'s CPU mask and torch's fused Adam.
STEP_ARITHMETIC = 2
#: Muon's Newton-Schulz arithmetic (a Muon checkpoint of another one starts a fresh run). 2: fp32, batched per
#: shape (``aiayn.train.optim.FP32Muon``; 1 was ``torch.optim.Muon``'s bf16).
MUON_ARITHMETIC = 2


def config_fingerprint(model_cfg: ModelConfig, train_cfg: TrainConfig, data_id: str) -> str:
    """SHA-256 over everything that makes checkpoints of two runs interchangeable.

    Budgets (``max_steps``, ``max_epochs``, ``max_time_s``) and cadence fields are
    excluded: extending a run's budget resumes it rather than restarting (under ``lr_decay:
    linear`` the decay then stretches to the new ``max_steps`` from the step reached; README).
    ``STEP_ARITHMETIC`` (and, for Muon, ``MUON_ARITHMETIC``) is in it: a checkpoint of an older training step
    starts a fresh run.
    """
    budget = {"max_steps", "max_epochs", "max_time_s", "validate_every", "checkpoint_every", "keep_checkpoints",
              "average_last", "log_every", "num_threads", "device",
              "distributed", "nproc_per_node", "compile", "loss_chunk_tokens", "max_skipped_updates",
              "epoch_checkpoints", "valid_bleu", "early_stop", "select"}
    if train_cfg.init_from is None:  # a run from scratch keeps the fingerprint it had before continued training
        budget |= {"init_from", "finetune"}
    if train_cfg.optimizer == "adam":  # Adam's checkpoints keep the fingerprint they had before Muon was a choice
        budget |= {"optimizer", "muon_momentum"}
    payload = {
        "model": model_cfg.model_dump(mode="json"),
        "train": {k: v for k, v in train_cfg.model_dump(mode="json").items() if k not in budget},
        "data": data_id,
        "step_arithmetic": STEP_ARITHMETIC,
    }
    if train_cfg.optimizer == "muon":
        payload["muon_arithmetic"] = MUON_ARITHMETIC
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


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
    early_stop: dict[str, Any] | None = None  # EarlyStopper.state_dict() when early stopping is on


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


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def _float(t: torch.Tensor) -> float:
    """A scalar tensor (or FSDP2's replicated DTensor) as a Python float."""
    return float(t.full_tensor() if hasattr(t, "full_tensor") else t)


class Trainer:
    """One training run: ``setup()``, then ``train()``; ``result`` is the ``TrainResult`` it fills.

    The arguments are ``train(...)``'s, whose docstring states what the run does, what it
    returns and raises. ``train()`` is ``step()`` while ``should_stop()`` is None, under
    SIGTERM/SIGINT handlers, then a last ``checkpoint()``; a caller may drive those steps
    itself. Every rank of a ``torch.distributed`` job runs the same calls in the same order
    (``should_stop``, ``checkpoint`` and FSDP's ``validate`` are collectives).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        train_split: EncodedSplit,
        valid_split: EncodedSplit | None,
        checkpoint_dir: str | Path,
        *,
        data_id: str = "",
        on_metrics: MetricsFn | None = None,
        on_step: StepFn | None = None,
        world: World | None = None,
        valid_scorer: ScorerFn | None = None,
        init_weights: dict[str, torch.Tensor] | None = None,
        replay: tuple[int, float] | None = None,
    ) -> None:
        self.model_cfg, self.cfg = model_cfg, train_cfg
        self.train_split, self.valid_split = train_split, valid_split
        self.checkpoint_dir = Path(checkpoint_dir)
        self.data_id = data_id
        self.on_metrics, self.on_step = on_metrics, on_step
        self.world = world or World()
        self.valid_scorer = valid_scorer
        self.init_weights, self.replay = init_weights, replay

    # --- setup ---------------------------------------------------------------------------------------------

    def setup(self, *, resume: bool = True) -> None:
        """Build model, data order and optimizer; with ``resume``, continue the newest compatible checkpoint.

        Raises ``ValueError`` (``grad_accum`` not a multiple of the world size, fp16 on CPU) and
        ``aiayn.checkpoint.CheckpointError`` (a corrupt checkpoint to resume).
        """
        self._setup_process()
        self.fingerprint = config_fingerprint(self.model_cfg, self.cfg, self.data_id)
        self._setup_model()
        self.iterator = self._batch_iterator()
        self.result = TrainResult(step=0, epoch=1, model=self.model)
        self._setup_validation()
        state, path = self._compatible_checkpoint() if resume else (None, None)
        if state is not None:
            self.model.load_state_dict(state.model)  # before sharding: every rank holds the full weights
        elif self.init_weights is not None:  # continued training: step 0 is the parent
            self.model.load_state_dict(self.init_weights)
        self.param_names = [name for name, _ in self.model.named_parameters()]  # the optimizer's parameter order
        self._setup_parallel()
        self._setup_optimizer()
        if state is not None and path is not None:
            self._resume(state, path)
        barrier(self.world)  # nobody trains before rank 0 has cleared foreign checkpoints
        self._mine = range(self.world.rank, self.cfg.grad_accum, self.world.world_size)  # this rank's batches
        self._signal = _StopSignal()  # installed by train(); never set when steps are driven by hand
        self._consecutive_skips = 0
        self._start_clock()

    def _batch_iterator(self) -> EpochBatchIterator:
        """The data order: ``train_split``'s batches, or with ``replay`` ``(n_new, share)`` the new pairs plus a
        ``share`` of each epoch drawn from the parent's pairs after them (``aiayn.data.replay``)."""
        cfg = self.cfg
        if self.replay is None:
            return EpochBatchIterator(self.train_split, max_tokens=cfg.max_tokens, data_seed=cfg.data_seed)
        from aiayn.data.replay import ReplayBatchIterator

        n_new, share = self.replay
        return ReplayBatchIterator(self.train_split, n_new=n_new, share=share, max_tokens=cfg.max_tokens,
                                   data_seed=cfg.data_seed)

    def _setup_validation(self) -> None:
        """Early stopping and the record of scheduled checkpoints. Raises ``ValueError`` for early stopping
        without a validation split."""
        es = self.cfg.early_stop
        if es.metric is not None and self.valid_split is None:
            raise ValueError("train.early_stop needs a validation split")
        self.early_stop = EarlyStopper(es.metric, es.patience, es.min_delta) if es.metric else None
        self._scheduled: set[int] = set()  # steps of checkpoints written on the schedule (grid or epoch end)
        self._warned_fsdp_scorer = False

    def _start_clock(self) -> None:
        """Zero the run's clock (``max_time_s``, ``train_seconds``) and the tokens/s window."""
        self._start = time.perf_counter()
        self._window_tokens, self._window_start = 0, time.perf_counter()

    def _setup_process(self) -> None:
        if self.cfg.grad_accum % self.world.world_size:
            raise ValueError(f"train.grad_accum={self.cfg.grad_accum} is not a multiple of the world size "
                             f"{self.world.world_size}: an update is grad_accum batches over all ranks together")
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)

    def _setup_model(self) -> None:
        """Device, seeded initialisation, parallel mode, fp16 loss scaler."""
        self.device = rank_device(self.cfg.device, self.world)
        if self.cfg.precision == "fp16" and self.device.type != "cuda":
            raise ValueError("train.precision=fp16 needs CUDA (use bf16 or fp32 on CPU)")
        torch.manual_seed(self.cfg.seed)
        self.model = Transformer(self.model_cfg, device=self.device)
        self.model.train()
        distributed = self.cfg.distributed if self.cfg.distributed != "none" else "ddp"
        self.mode = distributed if self.world.distributed else "none"
        self.scaler = torch.amp.GradScaler("cuda") if self.cfg.precision == "fp16" else None

    def _compatible_checkpoint(self) -> tuple[TrainState | None, Path | None]:
        """The newest checkpoint and its path when its fingerprint is ours; a foreign one is deleted (rank 0)."""
        existing = list_checkpoints(self.checkpoint_dir)
        state = load_checkpoint(existing[-1]) if existing else None
        if state is None or state.fingerprint == self.fingerprint:
            return state, existing[-1] if existing else None
        log.warning(
            "checkpoints in %s come from a different config or data (fingerprint %s.. != %s..); starting fresh",
            self.checkpoint_dir, state.fingerprint[:12], self.fingerprint[:12],
        )
        if self.world.is_main:
            for path in existing:
                path.unlink(missing_ok=True)
                path.with_suffix(".safetensors").unlink(missing_ok=True)
        return None, None

    def _setup_parallel(self) -> None:
        """``forward``: the model, DDP-wrapped or FSDP-sharded (in place) across ranks, compiled on request."""
        self.forward: Any = self.model
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (sinusoid tables) are deterministic: no per-forward broadcast.
            self.forward = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                forward_sync_buffers=False)
        elif self.mode == "fsdp":
            shard_fsdp(self.model, self.world, self.device)  # in place: parameters become DTensor shards
        if self.cfg.compile:
            self.forward = torch.compile(self.forward, dynamic=True)  # batches vary in shape: one graph, not one per shape

    def _lr(self, step: int) -> float:
        return lr_schedule(self.cfg, self.model_cfg.d_model)(step)

    def _setup_optimizer(self) -> None:
        cfg = self.cfg
        # torch's fused kernel: one pass over each parameter instead of ~12 small ops (a 3 % cheaper CPU step in
        # benchmarks/perf/train_step_cost.py); FSDP's DTensor shards keep the per-tensor loop
        self.optimizer = build_optimizer(self.model, cfg, lr=self._lr(1), fused=self.mode != "fsdp")

    def _resume(self, state: TrainState, path: Path) -> None:
        """Optimizer, data position, every RNG, loss scaler and the result so far, from ``state`` (read from ``path``)."""
        seed_then = state.extra.get("seed")
        if seed_then is not None and seed_then != self.cfg.seed:  # cannot happen with equal fingerprints
            log.warning("resuming a run trained with seed %s under seed %s", seed_then, self.cfg.seed)
        if self.mode == "fsdp":
            load_full_optimizer_state(self.model, self.optimizer, state.optimizer, self.param_names)
        else:
            self.optimizer.load_state_dict(state.optimizer)
        for group in self.optimizer.param_groups:  # a loaded group carries its writer's kernel (DDP's, FSDP's)
            if "fused" in group:
                group["fused"] = self.optimizer.defaults["fused"]
        self.iterator.load_state_dict(state.iterator)
        restore_rng(state.rng)
        if self.scaler is not None and "grad_scaler" in state.extra:
            self.scaler.load_state_dict(state.extra["grad_scaler"])
        self.result.step = self.result.resumed_from = state.step
        self.result.losses = {int(k): v for k, v in state.extra.get("losses", {}).items()}
        self.result.valid = {int(k): v for k, v in state.extra.get("valid", {}).items()}
        self.result.skipped_updates = int(state.extra.get("skipped_updates", 0))
        every = self.cfg.checkpoint_every
        self._scheduled = {int(s) for s in state.extra.get("scheduled_steps",
                                                            [s for s in range(every, state.step + 1, every)])}
        if self.early_stop is not None and "early_stop" in state.extra:
            self.early_stop.load_state_dict(state.extra["early_stop"])
        log.info("resumed from %s (step %d, epoch %d)", path.name, state.step, self.iterator.epoch)

    # --- the loop ------------------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Update until ``should_stop()`` gives a reason, checkpoint the last step, return ``result``.

        Call ``setup()`` first. SIGTERM/SIGINT stop the loop after the current update
        (``stopped_by="signal"``). Raises ``FloatingPointError`` as ``train(...)`` says.
        """
        self._start_clock()
        with self._signal:
            while (reason := self.should_stop()) is None:
                self.step()
        self.result.stopped_by = reason
        latest = list_checkpoints(self.checkpoint_dir) if self.world.is_main else []
        missing = self.world.is_main and (not latest or checkpoint_step(latest[-1]) != self.result.step)
        if agree(self.world, missing)[0]:  # rank 0 decides; with FSDP every rank takes part in the gather
            self.checkpoint()
        barrier(self.world)  # the last checkpoint is on disk before any rank returns
        self.result.train_seconds = time.perf_counter() - self._start
        self.result.epoch = self.iterator.epoch
        self.result.early_stop = self.early_stop.state_dict() if self.early_stop is not None else None
        return self.result

    def should_stop(self) -> str | None:
        """Why the run stops before the next update (``"max_steps"``, ``"max_epochs"``, ``"early_stop"``,
        ``"max_time_s"``, ``"signal"``), or None. Early stopping (decided where validation runs), the clock
        and signals are agreed by all ranks (one all-reduce)."""
        cfg, iterator = self.cfg, self.iterator
        if self.result.step >= cfg.max_steps:
            return "max_steps"
        if cfg.max_epochs is not None and iterator.epoch >= cfg.max_epochs and iterator.end_of_epoch:
            return "max_epochs"
        early, out_of_time, signalled = agree(
            self.world,
            self.early_stop is not None and self.early_stop.should_stop,
            cfg.max_time_s is not None and time.perf_counter() - self._start >= cfg.max_time_s,
            self._signal.received is not None,
        )
        if early:
            return "early_stop"
        if out_of_time:
            return "max_time_s"
        return "signal" if signalled else None

    def step(self) -> None:
        """One optimizer update over the next ``grad_accum`` global batches (this rank's share of them), then
        its reports, and validation and a checkpoint when the step is on their grid."""
        cfg, result = self.cfg, self.result
        epochs_before = self._epochs_done()
        update = [self.iterator.next_indices() for _ in range(cfg.grad_accum)]  # the global update
        n_tgt = sum(self.iterator.n_tgt_tokens(ix) for ix in update)  # global target tokens, same on every rank
        lr = self._lr(result.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = all_reduce_sum(self.world, [self._forward_backward(update, n_tgt)])[0]
        step_loss = loss_total / n_tgt
        grad_norm, finite = self._clip_and_update(step_loss)
        result.step += 1
        result.epoch = self.iterator.epoch
        self._count_skip(finite, step_loss, grad_norm)
        result.losses[result.step] = step_loss
        result.tokens += n_tgt
        self._report(step_loss, lr, grad_norm, n_tgt)
        epoch_end = cfg.epoch_checkpoints and self._epochs_done() > epochs_before  # an epoch's last batch was in it
        validate_now = self.valid_split is not None and (result.step % cfg.validate_every == 0 or epoch_end)
        # FSDP gathers parameters inside forward: every rank runs the (identical) validation
        if validate_now and (self.world.is_main or self.mode == "fsdp"):
            self.validate()
        scheduled = result.step % cfg.checkpoint_every == 0 or epoch_end
        keeps_validated = cfg.select.method in ("best", "average_best")  # "best" needs the validated weights kept
        if scheduled or (validate_now and keeps_validated):
            self.checkpoint(scheduled=scheduled)

    def _epochs_done(self) -> int:
        """Epochs whose every batch has been taken."""
        return self.iterator.epoch - (0 if self.iterator.end_of_epoch else 1)

    def _forward_backward(self, update: list[Any], n_tgt: int) -> float:
        """Gradients of this rank's batches of ``update``, each loss scaled by ``world_size / n_tgt``; returns
        the rank's summed (unscaled) loss. Dropout is reseeded per global batch (``dropout_seed``)."""
        loss_local = 0.0
        for j, k in enumerate(self._mine):
            b = collate(self.train_split, update[k])
            torch.manual_seed(dropout_seed(self.cfg.seed, self.result.step + 1, k))
            last = j == len(self._mine) - 1  # gradients are reduced over ranks after the last batch only
            if self.mode == "fsdp":
                self.model.set_requires_gradient_sync(last)
            with (self.forward.no_sync() if self.mode == "ddp" and not last else contextlib.nullcontext()):
                loss = self._batch_loss(b)
                scaled = loss * self.world.world_size / n_tgt
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_local += float(loss.detach())
        return loss_local

    def _batch_loss(self, b: Any) -> torch.Tensor:
        """The summed label-smoothed loss of batch ``b`` (a graph to backpropagate): the fused chunked output
        projection + loss when ``loss_chunk_tokens`` applies (fp32, not FSDP), else logits then the loss."""
        src, tgt_in, tgt_out = b.src.to(self.device), b.tgt_in.to(self.device), b.tgt_out.to(self.device)
        chunk = self.cfg.loss_chunk_tokens
        if chunk and self.cfg.precision == "fp32" and self.mode != "fsdp":
            hidden = self.forward(src, tgt_in, project=False)  # (B, T, d_model)
            return linear_label_smoothed_cross_entropy(hidden, self.model.tgt_embed.weight, tgt_out,
                                                       label_smoothing=self.cfg.label_smoothing, chunk_tokens=chunk)[0]
        with _autocast(self.device, self.cfg.precision):
            logits = self.forward(src, tgt_in)  # (B, T, V)
        return label_smoothed_cross_entropy(logits, tgt_out, label_smoothing=self.cfg.label_smoothing)[0]

    def _clip_and_update(self, step_loss: float) -> tuple[float, bool]:
        """Clip (or only measure) the global gradient norm and step Adam unless the loss or gradient is
        non-finite; returns ``(grad_norm, finite)``."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm is not None else math.inf  # inf: measure only
        grad_norm = _float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        finite = math.isfinite(grad_norm) and math.isfinite(step_loss)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the update itself on inf/nan gradients
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        return grad_norm, finite

    def _count_skip(self, finite: bool, step_loss: float, grad_norm: float) -> None:
        """Count a skipped update; raise ``FloatingPointError`` past ``max_skipped_updates`` in a row."""
        result = self.result
        if finite:
            self._consecutive_skips = 0
            return
        result.skipped_updates += 1
        self._consecutive_skips += 1
        log.warning("step %d: non-finite %s (loss %s, grad norm %s); update skipped (%d in a row, %d in all)",
                    result.step, "gradient" if math.isfinite(step_loss) else "loss", step_loss, grad_norm,
                    self._consecutive_skips, result.skipped_updates)
        if self.world.is_main and self.on_metrics:
            self.on_metrics({"skipped_updates": float(result.skipped_updates)}, result.step)
        if self._consecutive_skips > self.cfg.max_skipped_updates:
            raise FloatingPointError(
                f"{self._consecutive_skips} consecutive updates had a non-finite loss or gradient (step {result.step},"
                f" loss {step_loss}); lower lr_scale or check the data")

    def _report(self, step_loss: float, lr: float, grad_norm: float, n_tgt: int) -> None:
        """``on_step`` every step, ``on_metrics`` every ``log_every`` steps (rank 0); tokens/s over the window
        since the last ``on_metrics``."""
        step = self.result.step
        self._window_tokens += n_tgt
        now = time.perf_counter()
        tokens_per_s = self._window_tokens / max(now - self._window_start, 1e-9)
        if self.on_step and self.world.is_main:
            self.on_step(step, {"loss": step_loss, "lr": lr, "tokens_per_s": tokens_per_s,
                                "epoch": self.iterator.epoch, "tokens": n_tgt, "grad_norm": grad_norm})
        if self.on_metrics and self.world.is_main and step % self.cfg.log_every == 0:
            self.on_metrics({"loss": step_loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                             "epoch": float(self.iterator.epoch)}, step)
            self._window_tokens, self._window_start = 0, now

    def validate(self) -> None:
        """Validation loss (and ``valid_scorer``'s metrics, e.g. BLEU) of the current weights into
        ``result.valid``, then the early-stopping count (logged and reported on rank 0).

        Draws no random numbers: the run's weights are the same with or without it."""
        if self.valid_split is None:
            raise ValueError("Trainer.validate: this run has no validation split")
        metrics = validation_loss(self.model, self.valid_split, max_tokens=self.cfg.max_tokens,
                                  label_smoothing=self.cfg.label_smoothing)
        if self.valid_scorer is not None and self.mode != "fsdp":
            metrics |= self.valid_scorer(self.model)
        elif self.valid_scorer is not None and not self._warned_fsdp_scorer:
            self._warned_fsdp_scorer = True  # decoding calls encode/decode directly, outside FSDP's forward hooks
            log.warning("validation BLEU is not measured under FSDP (validation loss only)")
        self.result.valid[self.result.step] = metrics
        if self.early_stop is not None and self.early_stop.update(self.result.step, metrics):
            if self.world.is_main:
                log.info("early stop: %s", self.early_stop.reason())
        if self.world.is_main:
            log.info("step %d: %s", self.result.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
            if self.on_metrics:
                self.on_metrics(metrics, self.result.step)

    # --- checkpoints ---------------------------------------------------------------------------------------

    def checkpoint(self, *, scheduled: bool = False) -> None:
        """Write the full training state of the current step (rank 0) and prune old checkpoints.

        ``scheduled``: written on the schedule (the ``checkpoint_every`` grid or, with
        ``epoch_checkpoints``, an epoch's end): the checkpoints ``average_last`` averages.
        A collective under FSDP (every rank gathers, rank 0 gets the full tensors). Kept: the
        newest ``keep_checkpoints`` scheduled ones, the newest of all and, when ``select.method`` is
        ``best``/``average_best``, the 1 / ``average_last`` best validated ones.
        """
        if scheduled:
            self._scheduled.add(self.result.step)
        if self.mode == "fsdp":
            model_state, optim_state = full_state(self.model, self.optimizer, self.param_names)
        elif self.world.is_main:
            model_state, optim_state = self.model.state_dict(), self.optimizer.state_dict()
        if not self.world.is_main:
            return
        path = save_checkpoint(self.checkpoint_dir, self._train_state(model_state, optim_state))
        all_ckpts = list_checkpoints(self.checkpoint_dir)
        scheduled = [p for p in all_ckpts if checkpoint_step(p) in self._scheduled]
        best = set(self.best_validated())
        keep = (set(scheduled[-self.cfg.keep_checkpoints:]) | {all_ckpts[-1]}
                | {p for p in all_ckpts if checkpoint_step(p) in best})
        for old in all_ckpts:
            if old not in keep:
                old.with_suffix(".safetensors").unlink(missing_ok=True)
                old.unlink(missing_ok=True)
        self.result.checkpoints.append(path)

    def best_validated(self) -> list[int]:
        """Steps of the validated checkpoints ``select`` may pick (best first by ``select.metric``): 1 for
        ``best``, ``average_last`` for ``average_best``, none otherwise."""
        sel = self.cfg.select
        if sel.method not in ("best", "average_best"):
            return []
        k = 1 if sel.method == "best" else self.cfg.average_last
        sign = -1.0 if higher_is_better(sel.metric) else 1.0
        scored = [(sign * m[sel.metric], s) for s, m in self.result.valid.items() if sel.metric in m]
        return [s for _, s in sorted(scored)[:k]]

    def _train_state(self, model_state: dict[str, torch.Tensor], optim_state: dict[str, Any]) -> TrainState:
        cfg, result = self.cfg, self.result
        return TrainState(
            step=result.step,
            model=model_state,
            optimizer=optim_state,
            iterator=self.iterator.state_dict(),
            rng=capture_rng(),
            fingerprint=self.fingerprint,
            extra={"seed": cfg.seed, "data_seed": cfg.data_seed, "world_size": self.world.world_size,
                   "distributed": self.mode, "skipped_updates": result.skipped_updates,
                   **({"grad_scaler": self.scaler.state_dict()} if self.scaler is not None else {}),
                   **({"early_stop": self.early_stop.state_dict()} if self.early_stop is not None else {}),
                   "scheduled": result.step in self._scheduled, "scheduled_steps": sorted(self._scheduled),
                   "valid": {str(k): v for k, v in result.valid.items()},
                   "losses": {str(k): v for k, v in result.losses.items()}},
        )


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    train_split: EncodedSplit,
    valid_split: EncodedSplit | None,
    checkpoint_dir: str | Path,
    *,
    resume: bool = True,
    **options: Any,
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
        resume: continue the newest compatible checkpoint in ``checkpoint_dir``.
        options: ``Trainer``'s keyword arguments, each below.
        data_id: a string identifying the training data (e.g. its hash); part of
            the fingerprint.
        on_metrics: called as ``on_metrics({"loss": ..., "lr": ...}, step)``
            every ``log_every`` steps and after each validation (rank 0 only).
        on_step: called after every step with ``(step, {"loss", "lr", "tokens_per_s", "epoch",
            "tokens", "grad_norm"})`` (progress display; rank 0 only); ``tokens`` is the update's
            global target token count, ``grad_norm`` the global gradient L2 norm before clipping.
        world: this process's place in a ``torch.distributed`` job (``aiayn.train.distributed``;
            the process group must be initialised); default: one process.
        valid_scorer: more validation metrics of the model (``aiayn.train.validation.BleuValidator``:
            ``valid_bleu``, ``valid_chrf``), measured with the validation loss (not under FSDP); it
            must draw no random numbers, so the weights do not depend on it.
        init_weights: continued training (``train.init_from``): the parent's weights, the model's at step 0
            when no checkpoint is resumed; the optimizer starts fresh either way (``train_cfg``'s schedule).
        replay: ``(n_new, share)``: ``train_split`` holds ``n_new`` new pairs then the parent's pairs, ``share``
            of each epoch's pairs are drawn from the latter (``aiayn.data.replay.ReplayBatchIterator``).

    Early stopping (``train_cfg.early_stop``) counts validations without improvement; the count
    is saved in every checkpoint, so a resumed run stops where an uninterrupted one would
    (``stopped_by="early_stop"``). Validation and scheduled checkpoints also happen at each
    epoch's end with ``epoch_checkpoints``.

    Data parallelism is world-size invariant: an update is ``grad_accum`` consecutive
    batches of the one global order (``aiayn.data.batching``), rank ``r`` of ``N`` takes batches
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
    trainer = Trainer(model_cfg, train_cfg, train_split, valid_split, checkpoint_dir, **options)
    trainer.setup(resume=resume)
    return trainer.train()
