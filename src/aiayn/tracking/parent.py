"""The pipeline run: the one parent MLflow run that every stage's run of a pipeline run nests under.

Which pipeline run a stage joins (the parent rule):

1. ``AIAYN_PARENT_RUN_ID`` set: that run is the parent (an orchestrator such as the ``pipeline``
   flow made it and owns it: a stage never ends it).
2. Otherwise ``<project_root>/.aiayn/pipeline_run.json`` (local state, tracked by neither git nor
   DVC) names the current parent. It is reused when it was made for the same tracking URI and
   experiment, is still ``RUNNING``, and has no run for this stage yet. Else a fresh parent is
   started, and a recorded parent that is still running is ended as superseded (``FAILED`` if one
   of its stages failed or died, else ``FINISHED``). So the stages of one ``dvc repro`` share one
   parent, and running a stage a second time starts a new pipeline run.
3. The stage whose ``StageRecord`` says it ends the pipeline (the DAG's last stage) ends the parent
   with its own status and deletes the state file; ``end_pipeline_run`` ends it explicitly (a
   pipeline that stops earlier).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from aiayn.io import atomic_write_json
from aiayn.tracking.store import http_unreachable, resolve_tracking_uri, tracking_enabled

__all__ = ["STATE_FILE", "read_state", "resolve_parent", "finish_parent", "end_pipeline_run", "describe_pipeline",
           "DESCRIPTION_TAG"]

#: MLflow's run description (the run page's "Description", the runs table's tooltip).
DESCRIPTION_TAG = "mlflow.note.content"

log = logging.getLogger("aiayn.tracking")

#: Pipeline state, relative to the project root (not under artifacts/: untracked by DVC).
STATE_FILE = Path(".aiayn") / "pipeline_run.json"


def read_state(path: Path) -> dict[str, Any] | None:
    """The state file's content, or None when it is missing or not a pipeline state."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("run_id"), str) else None


def resolve_parent(client: Any, state_path: Path, *, tracking_uri: str, experiment_id: str,
                   stage: str) -> dict[str, Any]:
    """Pick or start the parent run for ``stage`` (rule 2); return the state naming it (``run_id``).
    The caller writes the state once its own run exists."""
    from mlflow.exceptions import MlflowException

    old = read_state(state_path)
    same_store = (
        old is not None
        and old.get("tracking_uri") == tracking_uri
        and old.get("experiment_id") == experiment_id
    )
    old_status = None
    if same_store:
        try:
            old_status = client.get_run(old["run_id"]).info.status
        except MlflowException:
            old_status = None  # deleted or a wiped store: start fresh
    stages = old.get("stages", {}) if old else {}
    if same_store and old_status == "RUNNING" and stage not in stages:
        return old
    if same_store and old_status == "RUNNING":
        _supersede(client, old)
    parent = client.create_run(experiment_id, run_name="pipeline", tags={"aiayn.kind": "pipeline"})
    return {"run_id": parent.info.run_id, "experiment_id": experiment_id, "tracking_uri": tracking_uri, "stages": {}}


def _supersede(client: Any, old: dict[str, Any]) -> None:
    """End a still-running parent that a new pipeline run replaces."""
    failed = False
    for info in old.get("stages", {}).values():
        status = info.get("status") if isinstance(info, dict) else None
        if status == "RUNNING":  # its process died without ending the child
            client.set_terminated(info["run_id"], status="KILLED")
        failed = failed or status in ("RUNNING", "FAILED", "KILLED")
    client.set_terminated(old["run_id"], status="FAILED" if failed else "FINISHED")


def finish_parent(client: Any, state_path: Path, *, parent_run_id: str, stage: str, run_id: str, status: str,
                  end: bool) -> None:
    """After ``stage``'s run ``run_id`` ended with ``status``: end the parent with the same status and
    delete the state (``end``), or record the stage's status in the state."""
    if end:
        client.set_terminated(parent_run_id, status=status)
        state_path.unlink(missing_ok=True)
        return
    state = read_state(state_path)
    if state is not None and state["run_id"] == parent_run_id:
        state.setdefault("stages", {})[stage] = {"run_id": run_id, "status": status}
        atomic_write_json(state_path, state)


def end_pipeline_run(
    project_root: str | Path,
    *,
    status: str = "FINISHED",
    tracking_uri: str | None = None,
    enabled: bool = True,
) -> str | None:
    """End the recorded parent run (``.aiayn/pipeline_run.json``) and delete the state file.

    For pipelines that stop before the last stage. Never raises for MLflow
    failures (logs one warning). Returns the ended run id, or None when there
    was no recorded run, tracking is off, or the state belongs to another
    tracking URI.

    Raises:
        ValueError: ``status`` is not FINISHED, FAILED or KILLED.
    """
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, got {status!r}")
    root = Path(project_root).resolve()
    state_path = root / STATE_FILE
    state = read_state(state_path)
    uri = resolve_tracking_uri(root, tracking_uri)
    if not tracking_enabled(enabled) or state is None or state.get("tracking_uri") != uri:
        return None
    why = http_unreachable(uri) if uri.startswith(("http://", "https://")) else None
    if why:
        log.warning("MLflow tracking: could not end pipeline run %s: %s", state["run_id"], why)
        return None
    try:
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=uri).set_terminated(state["run_id"], status=status)
    except Exception as e:  # noqa: BLE001 - tracking must never stop the pipeline
        log.warning("MLflow tracking: could not end pipeline run %s: %s: %s", state["run_id"], type(e).__name__, e)
        return None
    state_path.unlink(missing_ok=True)
    return state["run_id"]


def describe_pipeline(metrics: dict[str, float], tags: dict[str, str]) -> str:
    """The pipeline run's description (markdown), read at a glance, from its headline metrics and tags.

    First line: how training ended (``train.budget``; a run cut by the clock or a signal says so in bold,
    with ``train.budget_cut``). Then the headline scores (BLEU/chrF per test set, validation loss and
    BLEU), the model choice, the corpus (``data.corpus.*`` tags: kind, pair, revision), the data
    version and the code version.
    """
    lines = []
    budget = tags.get("train.budget")
    if tags.get("train.budget_cut"):
        lines.append(f"**WARNING: training {budget}**")
    elif budget:
        lines.append(f"Training {budget} (stopped by {tags.get('train.stopped_by', '?')} at step "
                     f"{tags.get('train.stop_step', '?')}).")
    else:
        lines.append("Training: no train stage in this pipeline run yet.")
    tests = sorted({k.rsplit(".", 1)[0] for k in metrics if k.endswith(".bleu") and not k.startswith("serving.")})
    if tests:
        lines += ["", "| test set | BLEU | chrF |", "|---|---:|---:|"]
        lines += [f"| {t} | {metrics[t + '.bleu']:.2f} | {metrics.get(t + '.chrf', float('nan')):.2f} |" for t in tests]
    lines += _validation_lines(metrics)
    if tags.get("train.selection"):
        lines += ["", f"Model: {tags['train.selection']}"]
    corpus = ", ".join(f"{k.removeprefix('data.corpus.')} {v}" for k, v in sorted(tags.items())
                       if k.startswith("data.corpus."))
    lines += ["", (f"Corpus: {corpus}. " if corpus else "")
              + f"Data version: `{tags.get('data.version', 'unknown')}`; code: `{tags.get('git.commit', 'no git')}`"
              + (" (uncommitted changes)" if tags.get("git.dirty") == "true" else "")]
    return "\n".join(lines)


#: (metric, label) of the validation lines: ``averaged_valid_*`` (a name kept for existing runs' metric
#: history) is the chosen model's, an average or a single checkpoint; ``valid_*`` the curve's last point:
#: the final state's (the train stage validates the last step too, off the ``validate_every`` grid).
_VALIDATION_LINES = (
    ("Validation of the chosen model", (("averaged_valid_loss", "loss"), ("averaged_valid_bleu", "BLEU"))),
    ("Last validation during training", (("valid_loss", "loss"), ("valid_bleu", "BLEU"))),
)


def _validation_lines(metrics: dict[str, float]) -> list[str]:
    """The description's validation lines, each saying whose scores they are (metric names in brackets)."""
    lines = []
    for label, keys in _VALIDATION_LINES:
        parts = [f"{name} {metrics[k]:.4g} (`{k}`)" for k, name in keys if k in metrics]
        if parts:
            lines += ["", f"{label}: " + ", ".join(parts)]
    return lines
