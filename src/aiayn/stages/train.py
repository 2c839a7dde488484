"""``train`` stage: encoded splits -> the chosen model bundle in ``artifacts/model``.

Outputs (DVC ``outs``, deterministic bytes for fixed params and data when the run ends by its step
budget or early stopping): ``model.safetensors`` (the weights ``train.select`` chose and validated:
by default the average of the last ``average_last`` scheduled checkpoints, ``aiayn.train.select``),
``model.json`` (resolved config + provenance: stop reason, budget line, the selection and why) and
``spm.model`` (copied from the tokenizer, so the bundle is self-contained); ``artifacts/train_metrics.json``
opens with ``budget`` (whether the run reached its budget or was CUT by the clock or a signal) and
holds the chosen model's validation metrics; ``artifacts/plots/train_loss.tsv`` and
``artifacts/plots/validation.tsv`` (DVC ``plots``) hold the per-step training loss and the
validation curves. Wall-clock numbers (tokens/s, seconds) go to the tracker and the log only, never
into DVC outputs.

Step checkpoints live in ``artifacts/checkpoints`` (not a DVC output): a killed
run, re-run with the same params, resumes from the newest one.

Continued training (``train.init_from``, ``aiayn.init_from``): the run starts from the parent the tokenize stage
encoded the corpus for (its weights at step 0, a fresh optimizer and schedule, ``train.finetune``); the run's
tags name the parent (``aiayn.parent_model``, ``aiayn.parent_version``, ``aiayn.parent_run_id``), ``model.json``
holds it under ``adapted_from`` and ``artifacts/parent_model.json`` (a DVC output, so ``dvc.lock`` records
which parent was used) names it: URI, version, source run, sha256 of the weights (``{"init_from": null}`` for a
run from scratch).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from typing import Any

import torch

from aiayn.checkpoint import list_checkpoints, load_checkpoint, save_model
from aiayn.config.schema import Params, TrainConfig
from aiayn.exitcodes import CUT_PREFIX
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text, sha256_file
from aiayn.progress import Progress
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord, StageRun
from aiayn.stages import Layout, split_reads
from aiayn.stages.train_job import (METRICS_FILE, PARAMS_FILE, RESULT_FILE, bleu_validator, load_train_inputs,
                                    result_from_job)
from aiayn.train import TrainResult, lr_schedule, select_weights, train, validation_loss
from aiayn.train.schedule import finetune_train_config
from aiayn.train.select import Selection, checkpoint_extra

__all__ = ["run", "RECORD", "budget_line", "weights_evaluator", "CUT_REASONS"]

log = logging.getLogger("aiayn")

#: How a train run is recorded: its validation loss and BLEU are the pipeline run's headline, so is how it
#: stopped (tags), its params are the pipeline run's, and it reads the raw corpus (plus the training and
#: validation splits, added by ``run``).
RECORD = StageRecord("train", headline_metrics=r"^(averaged_)?valid_(loss|ppl|bleu|chrf)$",
                     headline_tags=r"^train\.(budget|stopped_by|stop_step|selection|budget_cut)$",
                     params_on_parent=True, source_data=True)

#: Stop reasons that cut a run short of its configured budget (not reproducible; the model is not the configured one).
CUT_REASONS = ("max_time_s", "signal")


def budget_line(stopped_by: str, step: int, cfg: TrainConfig, early: str | None = None) -> str:
    """One line on how the run ended: ``complete: ...`` (its step budget, epoch budget or early stopping) or
    ``CUT by <reason> ...`` (the clock or a signal: not reproducible). The first line of every report."""
    if stopped_by in CUT_REASONS:
        return (f"{CUT_PREFIX} by {stopped_by} at step {step} of max_steps {cfg.max_steps}: training did not finish; "
                "the model is not the configured one and not reproducible")
    if stopped_by == "early_stop":
        return f"complete: early stop at step {step} of max_steps {cfg.max_steps} ({early or 'patience exhausted'})"
    if stopped_by == "max_epochs":
        return f"complete: max_epochs {cfg.max_epochs} reached at step {step}"
    return f"complete: max_steps {cfg.max_steps} reached"


class _TrainProgress:
    """The training bar: step/total, ETA, loss, tokens/s and the latest validation BLEU (``aiayn.progress``)."""

    def __init__(self, total: int, every: int) -> None:
        self.progress = Progress("train", total, every=every, unit="step")
        self.valid: dict[str, float] = {}

    def __enter__(self) -> "_TrainProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def on_valid(self, metrics: dict[str, float]) -> None:
        """Keep the latest validation metrics (shown on the bar from then on)."""
        self.valid.update({k: v for k, v in metrics.items() if k in ("valid_loss", "valid_bleu")})

    def __call__(self, step: int, m: dict[str, float]) -> None:
        info = f"epoch {int(m['epoch'])} loss {m['loss']:.3f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s"
        if "valid_loss" in self.valid:
            info += f" | valid loss {self.valid['valid_loss']:.3f}"
        if "valid_bleu" in self.valid:
            info += f" BLEU {self.valid['valid_bleu']:.2f}"
        self.progress.update(step, info)


def _rank_env() -> dict[str, str]:
    """The environment of the ranks the launcher starts: this process's, with MKL's setting stated (``AUTO``, MKL's
    own kernels, when unset here), so that they sum as this process does: a rank started by hand applies the train
    stage's defaults itself (``aiayn.config.settings.FP32_STAGE_DEFAULT``), which may hold MKL to AVX2."""
    return os.environ | {"MKL_CBWR": os.environ.get("MKL_CBWR") or "AUTO"}


def _train_torchrun(params: Params, layout: Layout, tracker: StageRun, progress: _TrainProgress) -> TrainResult:
    """Run ``train`` on ``params.train.nproc_per_node`` ranks through torchrun (``aiayn.stages.train_worker``).

    The launcher keeps the MLflow run: it forwards rank 0's metrics (``metrics.jsonl``) to
    ``tracker`` while the job runs, and passes SIGTERM/SIGINT on to torchrun, which passes
    it to every rank (they agree on the step, rank 0 checkpoints). Returns the rank-0
    result with a fresh model on CPU (the caller loads the chosen weights into it).
    Raises ``RuntimeError`` when torchrun fails (the ranks' errors are on stderr).
    """
    from aiayn.train.distributed import torchrun_command
    from aiayn.model import Transformer

    job_dir = layout.checkpoints / "torchrun"
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.mkdir(parents=True)
    atomic_write_text(job_dir / PARAMS_FILE, params.model_dump_json())
    cmd = torchrun_command(params.train.nproc_per_node, "aiayn.stages.train_worker", str(layout.root.resolve()),
                           str(job_dir.resolve()))
    log.info("train: launching %d ranks: %s", params.train.nproc_per_node, " ".join(cmd))
    proc = subprocess.Popen(cmd, env=_rank_env())
    forwarded: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        proc.send_signal(signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    offset = 0
    try:
        while True:
            done = proc.poll() is not None
            metrics_path = job_dir / METRICS_FILE
            if metrics_path.exists():
                with metrics_path.open(encoding="utf-8") as f:
                    f.seek(offset)
                    for line in f:
                        if not line.endswith("\n"):
                            break  # a line being written: read it next time
                        offset += len(line.encode("utf-8"))
                        record = json.loads(line)
                        tracker.log_metrics(record["metrics"], step=record["step"])
                        m = record["metrics"]
                        progress.on_valid(m)
                        if "loss" in m:
                            progress(record["step"], {**m, "epoch": m.get("epoch", 0)})
            if done:
                break
            time.sleep(0.5)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    result_path = job_dir / RESULT_FILE
    if not result_path.exists():
        raise RuntimeError(f"torchrun exited with status {proc.returncode} before rank 0 wrote {result_path}"
                           f"{' (interrupted)' if forwarded else ''}; the ranks' errors are above")
    summary = json.loads(result_path.read_text(encoding="utf-8"))
    if proc.returncode != 0 and summary["stopped_by"] != "signal":
        raise RuntimeError(f"torchrun exited with status {proc.returncode}; the ranks' errors are above")
    return result_from_job(summary, Transformer(params.model))


def _validation_metrics(model: torch.nn.Module, cfg: TrainConfig, valid_split: Any, scorer: Any,
                        bleu: bool = True) -> dict[str, float]:
    """``model``'s validation metrics as training logs them: ``valid_loss``/``valid_nll``/``valid_ppl``
    (``aiayn.train.validation_loss``), and ``valid_bleu``/``valid_chrf`` from ``scorer`` (the same sample and
    decoding as during training) when ``bleu`` and the run validates BLEU (``scorer`` not None)."""
    metrics = validation_loss(model, valid_split, max_tokens=cfg.max_tokens, label_smoothing=cfg.label_smoothing)
    if bleu and scorer is not None:
        metrics |= scorer(model)
    return metrics


def weights_evaluator(model: torch.nn.Module, params: Params, valid_split: Any, scorer: Any):
    """``weights -> validation metrics`` for ``aiayn.train.select_weights``, as the train stage scores its
    candidates: ``weights`` loaded into ``model``, ``valid_loss``/``valid_nll``/``valid_ppl`` always, and
    ``valid_bleu``/``valid_chrf`` from ``scorer`` (``stages.train_job.bleu_validator``) when
    ``train.select.metric`` is ``valid_bleu``. Raises ``RuntimeError`` when ``weights`` do not fit ``model``."""
    cfg = params.train

    def evaluate(weights: dict[str, torch.Tensor]) -> dict[str, float]:
        model.load_state_dict(weights)
        return _validation_metrics(model, cfg, valid_split, scorer, bleu=cfg.select.metric == "valid_bleu")

    return evaluate


def _validate_final_state(valid: dict[int, dict[str, float]], result: TrainResult, selection: Selection,
                          final: dict[str, float], params: Params, layout: Layout, valid_split: Any, scorer: Any,
                          tracker: StageRun) -> None:
    """End the validation curve at the last step: training validates on the ``validate_every`` grid (and at epoch
    ends), so a run of 1900 steps validated every 500 showed nothing after step 1500. Adds the final state's
    validation (the same metrics as during training) to ``valid`` and the tracker's curves at ``result.step``:
    the chosen model's own when it is that state (no extra cost), else one more validation of the last
    checkpoint. Nothing when that step was validated already or the run has no validation split."""
    if result.step in valid or valid_split is None:
        return
    if selection.kind == "single" and selection.steps == [result.step]:
        metrics = dict(final)
    else:
        model = result.model
        model.load_state_dict(load_checkpoint(list_checkpoints(layout.checkpoints)[-1]).model)
        metrics = _validation_metrics(model, params.train, valid_split, scorer)
        model.load_state_dict(selection.weights)
    log.info("step %d (final state): %s", result.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    valid[result.step] = metrics
    tracker.log_metrics(metrics, step=result.step)


def _write_plots(layout: Layout, result: TrainResult, valid: dict[int, dict[str, float]], params: Params) -> None:
    """``plots/train_loss.tsv`` (step, loss, lr per step) and ``plots/validation.tsv`` (step and every validation
    metric): the curves ``dvc plots show`` draws; deterministic bytes (no wall-clock columns)."""
    # the optimizer's own schedule, whatever lr_decay (a continued run's fresh one; d_model is the parent's then)
    lr = lr_schedule(finetune_train_config(params.train), params.model.d_model)
    lines = ["step\tloss\tlr"] + [f"{s}\t{loss:.6f}\t{lr(s):.6e}" for s, loss in sorted(result.losses.items())]
    keys = sorted({k for m in valid.values() for k in m})
    vlines = ["\t".join(["step", *keys])] + [
        "\t".join([str(s), *(f"{valid[s][k]:.6f}" if k in valid[s] else "" for k in keys)]) for s in sorted(valid)]
    layout.plots.mkdir(parents=True, exist_ok=True)
    atomic_write_text(layout.plots / "train_loss.tsv", "\n".join(lines) + "\n")
    atomic_write_text(layout.plots / "validation.tsv", "\n".join(vlines) + "\n")


def _train(params: Params, layout: Layout, tracker: StageRun, inputs: Any, scorer: Any) -> TrainResult:
    """Run the training loop (one process or torchrun) with the progress bar; raise on a signal."""
    cfg = inputs.train_cfg  # params.train, or a continued run's fresh schedule
    with _TrainProgress(cfg.max_steps, cfg.log_every) as progress:
        if cfg.nproc_per_node > 1:
            result = _train_torchrun(params.model_copy(update={"model": inputs.model_cfg}), layout, tracker, progress)
        else:
            def on_metrics(metrics: dict[str, float], step: int) -> None:
                tracker.log_metrics(metrics, step=step)
                progress.on_valid(metrics)

            result = train(inputs.model_cfg, cfg, inputs.train_split, inputs.valid_split, layout.checkpoints,
                           data_id=inputs.data_id, on_metrics=on_metrics, on_step=progress, valid_scorer=scorer,
                           **inputs.trainer_options())
    if result.stopped_by == "signal":
        raise InterruptedError(
            f"training interrupted at step {result.step}; checkpoint saved in {layout.checkpoints}, rerun to resume"
        )
    return result


def _record(tracker: StageRun, result: TrainResult, selection: Selection, final: dict[str, float],
            budget: str, early: dict[str, Any] | None) -> float:
    """Log the chosen model's metrics, the stop, the budget line and the selection; returns tokens/s."""
    tokens_per_s = result.tokens / max(result.train_seconds, 1e-9)
    # "averaged_" (a name kept for existing runs' metric history): the chosen model's metrics, an average or a
    # single checkpoint
    tracker.log_metrics({f"averaged_{k}": v for k, v in final.items()}, step=result.step)
    tracker.log_metrics({"train_seconds": result.train_seconds, "train_tokens_per_s": tokens_per_s}, step=result.step)
    tags = {"train.budget": budget, "train.stopped_by": result.stopped_by, "train.stop_step": result.step,
            "train.selection": selection.summary()}
    if result.stopped_by in CUT_REASONS:
        tags["train.budget_cut"] = result.stopped_by
    if early is not None:
        tags["train.early_stop"] = json.dumps(early)
    tracker.set_tags(tags)
    return tokens_per_s


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Train with ``params.train`` on ``layout.tokenized``; choose and validate the model (``train.select``); write
    the bundle to ``layout.model``; record the run (params, per-step metrics, the stop, the choice, the model
    folder) into ``recorder``.

    Returns a summary: steps, epochs, stop reason, budget line, the selection, the chosen model's
    validation metrics, tokens/s. Raises ``FileNotFoundError`` if the tokenize (or, with validation
    BLEU, the prepare) stage has not run, ``InterruptedError`` when a signal stopped training (the
    checkpoint is saved: rerun to resume).
    """
    cfg = params.train
    if cfg.keep_checkpoints < cfg.average_last:
        raise ValueError(f"train.keep_checkpoints={cfg.keep_checkpoints} < train.average_last={cfg.average_last}")
    inputs = load_train_inputs(params, layout, getattr(recorder, "resolve_registered_model", None))
    scorer = bleu_validator(params, layout, inputs)
    langs = (params.data.src_lang, params.data.tgt_lang)
    record = RECORD.reading(*split_reads(layout, [params.data.train_split], langs, "training"),
                            *split_reads(layout, [params.data.valid_split], langs, "validation"))
    with recorder.start(record) as tracker:
        tracker.log_params(params.to_flat_dict() | {"model.vocab_size": inputs.model_cfg.vocab_size})
        tracker.set_tags({"seed": str(cfg.seed), "data_seed": str(cfg.data_seed), "model_preset": params.model_preset})
        if inputs.parent is not None:
            tracker.set_tags(_parent_tags(inputs.parent.record()))
        result = _train(params, layout, tracker, inputs, scorer)
        extra = checkpoint_extra(list_checkpoints(layout.checkpoints)[-1])
        valid = {int(k): v for k, v in extra.get("valid", {}).items()}
        early = extra.get("early_stop")
        model = result.model
        selection = select_weights(layout.checkpoints, cfg, weights_evaluator(model, params, inputs.valid_split, scorer))
        model.load_state_dict(selection.weights)
        final = _validation_metrics(model, cfg, inputs.valid_split, scorer)
        _validate_final_state(valid, result, selection, final, params, layout, inputs.valid_split, scorer, tracker)
        early_reason = _early_reason(early) if result.stopped_by == "early_stop" else None
        budget = budget_line(result.stopped_by, result.step, cfg, early_reason)
        (log.warning if result.stopped_by in CUT_REASONS else log.info)("train: %s", budget)
        for note in selection.notes:
            (log.warning if note.startswith("WARNING") or selection.replaced else log.info)("train: select: %s", note)
        _write_outputs(params, layout, inputs, result, selection, final, budget, early)
        _write_plots(layout, result, valid, params)
        tokens_per_s = _record(tracker, result, selection, final, budget, early)
        tracker.log_artifacts(layout.model, artifact_path="model")
        tracker.log_artifacts(layout.plots, artifact_path="plots")
    summary = {
        "budget": budget,
        "step": result.step,
        "epoch": result.epoch,
        "stopped_by": result.stopped_by,
        "resumed_from": result.resumed_from,
        "averaged_steps": selection.steps,
        "selection": selection.summary(),
        "train_seconds": round(result.train_seconds, 1),
        "tokens_per_s": round(tokens_per_s, 1),
        "skipped_updates": result.skipped_updates,
        "world_size": cfg.nproc_per_node,
        **final,
    }
    log.info("train: %s", summary)
    return summary


def _parent_tags(parent: dict[str, Any]) -> dict[str, str]:
    """The train run's tags naming the parent it continued (``aiayn.parent_*``)."""
    return {"aiayn.parent_model": parent["uri"], "aiayn.parent_version": str(parent["version"] or ""),
            "aiayn.parent_run_id": str(parent["run_id"] or ""), "aiayn.parent_weights_sha256": parent["weights_sha256"]}


def _parent_line(inputs: Any) -> dict[str, Any]:
    """``artifacts/parent_model.json``: the parent continued (URI, version, source run, sha256 of weights and
    vocabulary), or ``{"init_from": null}``."""
    if inputs.parent is None:
        return {"init_from": None}
    record = inputs.parent.record()
    return {"init_from": record["uri"]} | {k: record[k] for k in ("version", "run_id", "weights_sha256", "spm_sha256")}


def _early_reason(early: dict[str, Any] | None) -> str | None:
    if not early:
        return None
    return (f"no {early['metric']} improvement for the patience; best {early['best']:.4f} at step "
            f"{early['best_step']}")


def _write_outputs(params: Params, layout: Layout, inputs: Any, result: TrainResult, selection: Selection,
                   final: dict[str, float], budget: str, early: dict[str, Any] | None) -> None:
    """``layout.model`` (weights, ``spm.model``, ``model.json``) and ``train_metrics.json`` (``budget`` first)."""
    cfg, model_cfg = params.train, inputs.model_cfg
    with atomic_dir(layout.model) as out:
        save_model(out / "model.safetensors", selection.weights)
        shutil.copyfile(inputs.spm_path, out / "spm.model")
        atomic_write_json(out / "model.json", {
            "model": model_cfg.model_dump(mode="json"),
            "model_preset": params.model_preset,
            "step": result.step,
            "stopped_by": result.stopped_by,
            "budget": budget,
            "averaged_steps": selection.steps,
            "selection": selection.record(),
            **({"early_stop": early} if early is not None else {}),
            **({"adapted_from": _parent_line(inputs)} if inputs.parent is not None else {}),
            "seed": cfg.seed,
            "data_seed": cfg.data_seed,
            "tokenizer_sha256": sha256_file(inputs.spm_path),
        })
    atomic_write_json(layout.parent_model, _parent_line(inputs))
    atomic_write_json(layout.train_metrics, {
        "budget": budget,
        "step": result.step,
        "epoch": result.epoch,
        "stopped_by": result.stopped_by,
        "selection": {"method": selection.method, "kind": selection.kind, "replaced": selection.replaced,
                      selection.metric: round(selection.value, 6)},
        **{k: round(v, 6) for k, v in final.items()},
    })
