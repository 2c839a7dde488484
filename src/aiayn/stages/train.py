"""``train`` stage: encoded splits -> averaged model bundle in ``artifacts/model``.

Outputs (DVC ``outs``, deterministic bytes for fixed params and data):
``model.safetensors`` (average of the last ``average_last`` checkpoints),
``model.json`` (resolved config + provenance) and ``spm.model`` (copied from
the tokenizer, so the bundle is self-contained); ``artifacts/train_metrics.json``
holds the validation loss of the averaged model. Wall-clock numbers (tokens/s, seconds) go to the
tracker and the log only, never into DVC outputs.

Step checkpoints live in ``artifacts/checkpoints`` (not a DVC output): a killed
run, re-run with the same params, resumes from the newest one.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiayn.checkpoint import save_model
from aiayn.config import Params
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text, sha256_file
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord, StageRun
from aiayn.stages import Layout, split_reads
from aiayn.stages.train_job import METRICS_FILE, PARAMS_FILE, RESULT_FILE, load_train_inputs, result_from_job
from aiayn.train import TrainResult, averaged_weights, train, validation_loss

__all__ = ["run", "RECORD"]

log = logging.getLogger("aiayn")

#: How a train run is recorded: its validation loss is the pipeline run's headline, its params are the
#: pipeline run's, and it reads the raw corpus (plus the training and validation splits, added by ``run``).
RECORD = StageRecord("train", headline_metrics=r"^(averaged_)?valid_(loss|ppl)$", params_on_parent=True,
                     source_data=True)


class _Progress:
    """A rich progress bar on a terminal; a log line every ``every`` steps otherwise."""

    def __init__(self, total: int, every: int) -> None:
        self.total, self.every = total, every
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[info]}"), transient=False)
            self.task = self.bar.add_task("train", total=total, info="")

    def __enter__(self) -> "_Progress":
        if self.bar:
            self.bar.start()
        return self

    def __call__(self, step: int, m: dict[str, float]) -> None:
        info = f"epoch {int(m['epoch'])} loss {m['loss']:.3f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s"
        if self.bar:
            self.bar.update(self.task, completed=step, info=info)
        elif step % self.every == 0:
            log.info("step %d/%d %s", step, self.total, info)

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.stop()


def _train_torchrun(params: Params, layout: Layout, tracker: StageRun, progress: _Progress) -> TrainResult:
    """Run ``train`` on ``params.train.nproc_per_node`` ranks through torchrun (``aiayn.stages.train_worker``).

    The launcher keeps the MLflow run: it forwards rank 0's metrics (``metrics.jsonl``) to
    ``tracker`` while the job runs, and passes SIGTERM/SIGINT on to torchrun, which passes
    it to every rank (they agree on the step, rank 0 checkpoints). Returns the rank-0
    result with a fresh model on CPU (the caller loads the averaged weights into it).
    Raises ``RuntimeError`` when torchrun fails (the ranks' errors are on stderr).
    """
    from aiayn.distributed import torchrun_command
    from aiayn.model import Transformer

    job_dir = layout.checkpoints / "torchrun"
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.mkdir(parents=True)
    atomic_write_text(job_dir / PARAMS_FILE, params.model_dump_json())
    cmd = torchrun_command(params.train.nproc_per_node, "aiayn.stages.train_worker", str(layout.root.resolve()),
                           str(job_dir.resolve()))
    log.info("train: launching %d ranks: %s", params.train.nproc_per_node, " ".join(cmd))
    proc = subprocess.Popen(cmd)
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


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Train with ``params.train`` on ``layout.tokenized``; write the bundle to ``layout.model``; record the
    run (params, per-step metrics, the model folder) into ``recorder``.

    Returns a summary: steps, epochs, stop reason, final validation metrics,
    tokens/s. Raises ``FileNotFoundError`` if the tokenize stage has not run.
    """
    cfg = params.train
    if cfg.keep_checkpoints < cfg.average_last:
        raise ValueError(f"train.keep_checkpoints={cfg.keep_checkpoints} < train.average_last={cfg.average_last}")
    inputs = load_train_inputs(params, layout)
    model_cfg, valid_split, spm_path = inputs.model_cfg, inputs.valid_split, inputs.spm_path

    langs = (params.data.src_lang, params.data.tgt_lang)
    record = RECORD.reading(*split_reads(layout, [params.data.train_split], langs, "training"),
                            *split_reads(layout, [params.data.valid_split], langs, "validation"))
    with recorder.start(record) as tracker:
        tracker.log_params(params.to_flat_dict() | {"model.vocab_size": model_cfg.vocab_size})
        tracker.set_tags({"seed": str(cfg.seed), "data_seed": str(cfg.data_seed), "model_preset": params.model_preset})
        with _Progress(cfg.max_steps, cfg.log_every) as progress:
            if cfg.nproc_per_node > 1:
                result = _train_torchrun(params.model_copy(update={"model": model_cfg}), layout, tracker, progress)
            else:
                result = train(
                    model_cfg, cfg, inputs.train_split, valid_split, layout.checkpoints,
                    data_id=inputs.data_id, on_metrics=tracker.log_metrics, on_step=progress,
                )
        if result.stopped_by == "signal":
            raise InterruptedError(
                f"training interrupted at step {result.step}; checkpoint saved in {layout.checkpoints}, rerun to resume"
            )
        weights, steps = averaged_weights(layout.checkpoints, cfg.average_last, every=cfg.checkpoint_every)
        model = result.model
        model.load_state_dict(weights)
        final = validation_loss(model, valid_split, max_tokens=cfg.max_tokens, label_smoothing=cfg.label_smoothing)

        with atomic_dir(layout.model) as out:
            save_model(out / "model.safetensors", weights)
            shutil.copyfile(spm_path, out / "spm.model")
            atomic_write_json(out / "model.json", {
                "model": model_cfg.model_dump(mode="json"),
                "model_preset": params.model_preset,
                "step": result.step,
                "averaged_steps": steps,
                "seed": cfg.seed,
                "data_seed": cfg.data_seed,
                "tokenizer_sha256": sha256_file(spm_path),
            })
        atomic_write_json(layout.train_metrics, {
            "step": result.step,
            "epoch": result.epoch,
            **{k: round(v, 6) for k, v in final.items()},
        })
        tokens_per_s = result.tokens / max(result.train_seconds, 1e-9)
        tracker.log_metrics({f"averaged_{k}": v for k, v in final.items()}, step=result.step)
        tracker.log_metrics({"train_seconds": result.train_seconds, "train_tokens_per_s": tokens_per_s}, step=result.step)
        tracker.log_artifacts(layout.model, artifact_path="model")
    summary = {
        "step": result.step,
        "epoch": result.epoch,
        "stopped_by": result.stopped_by,
        "resumed_from": result.resumed_from,
        "averaged_steps": steps,
        "train_seconds": round(result.train_seconds, 1),
        "tokens_per_s": round(tokens_per_s, 1),
        "skipped_updates": result.skipped_updates,
        "world_size": cfg.nproc_per_node,
        **final,
    }
    log.info("train: %s", summary)
    return summary
