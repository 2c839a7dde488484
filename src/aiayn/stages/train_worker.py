"""One rank of a distributed ``train`` stage: ``python -m aiayn.stages.train_worker ROOT JOB_DIR``.

Started by ``torchrun`` (the ``train`` stage launches it when ``train.nproc_per_node > 1``;
for several nodes start it yourself, see ``aiayn.train.distributed``). ``JOB_DIR`` holds
``params.json`` (the resolved ``Params``, written by the launcher); rank 0 appends its
metrics to ``JOB_DIR/metrics.jsonl`` (one ``{"step", "metrics"}`` object per line, read
live by the launcher, which owns the MLflow run) and writes ``JOB_DIR/result.json`` at the
end. Checkpoints go to ``layout.checkpoints`` as in a one-process run, so either kind of
run resumes the other's.

Exit status: 0 when training stopped normally or by a signal (``result.json`` says
which); 1 on an error (its message on stderr).
"""

from __future__ import annotations

if __name__ == "__main__":  # a rank's own process (torchrun, or started by hand on each node): the stage's
    from aiayn.config.settings import apply_process_defaults  # process defaults, before the imports below load torch

    apply_process_defaults(stage="train")

import json  # noqa: E402
import logging
import sys
from pathlib import Path
from typing import Any

from aiayn.config.schema import Params
from aiayn.train.distributed import init_process_group, rank_device, world_from_env
from aiayn.io import atomic_write_json
from aiayn.stages import Layout
from aiayn.stages.train_job import METRICS_FILE, PARAMS_FILE, RESULT_FILE, job_summary, load_train_inputs
from aiayn.train import train

__all__ = ["main", "run_rank", "PARAMS_FILE", "METRICS_FILE", "RESULT_FILE"]

log = logging.getLogger("aiayn")


def run_rank(root: Path, job_dir: Path) -> dict[str, Any]:
    """Train as this process's rank; return the ``TrainResult`` summary (written by rank 0)."""
    params = Params.model_validate_json((job_dir / PARAMS_FILE).read_text(encoding="utf-8"))
    layout = Layout(root)
    world = world_from_env()
    backend = init_process_group(world, rank_device(params.train.device, world))
    log.info("rank %d/%d (%s) started", world.rank, world.world_size, backend)
    # The model is sized by the tokenizer, as in the one-process stage (a hand-written params.json need not carry it);
    # a registered parent (train.init_from) was resolved by the launcher: it is read from the project's kept copy.
    inputs = load_train_inputs(params, layout)
    metrics_file = (job_dir / METRICS_FILE).open("a", encoding="utf-8") if world.is_main else None

    def on_metrics(metrics: dict[str, float], step: int) -> None:
        assert metrics_file is not None
        metrics_file.write(json.dumps({"step": step, "metrics": metrics}) + "\n")
        metrics_file.flush()

    try:
        result = train(inputs.model_cfg, inputs.train_cfg, inputs.train_split, inputs.valid_split, layout.checkpoints,
                       data_id=inputs.data_id, on_metrics=on_metrics if world.is_main else None, world=world,
                       **inputs.trainer_options())
    finally:
        if metrics_file is not None:
            metrics_file.close()
    summary = job_summary(result, world.world_size)
    if world.is_main:
        atomic_write_json(job_dir / RESULT_FILE, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m aiayn.stages.train_worker ROOT JOB_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        run_rank(Path(args[0]), Path(args[1]))
    except Exception as e:  # noqa: BLE001 - one line per rank, torchrun reports the failed rank
        print(f"train worker failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
