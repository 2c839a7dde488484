"""Runs outside any pipeline run: one flat run per drift check and per study, and a study's way of
reading stage metrics back.

Like a stage's run, these never fail their caller: tracking off (``AIAYN_TRACKING=0``) records
nothing, and an unreachable server or a failing MLflow call logs one warning ("MLflow tracking
disabled: ...") and records nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiayn.recording import BAD_KEY_CHARS, MAX_KEY_LEN, param_value
from aiayn.tracking.lineage import git_tags
from aiayn.tracking.store import chunks, experiment_id, open_http, open_sqlite, resolve_tracking_uri, tracking_enabled

__all__ = ["DRIFT_EXPERIMENT", "log_drift_check", "log_study", "stage_metrics_by_experiment"]

log = logging.getLogger("aiayn.tracking")

#: Experiment of the drift checks (one flat run per check, apart from the pipeline runs).
DRIFT_EXPERIMENT = "aiayn-drift"


def _standalone_run(project_root: str | Path, tracking_uri: str | None,
                    record: Callable[[Any, Path, str], str]) -> str | None:
    """Open the project's tracking store and call ``record(client, root, uri) -> run_id`` for a run
    outside any pipeline (a drift check, a study). Never fails the caller: tracking off
    (``AIAYN_TRACKING=0``) returns None; an unreachable server or any failing MLflow call logs one
    warning ("MLflow tracking disabled: ...") and returns None."""
    if not tracking_enabled(True):
        return None
    root = Path(project_root).resolve()
    uri = resolve_tracking_uri(root, tracking_uri)
    why = open_http(uri)
    if why:
        log.warning("MLflow tracking disabled: %s", why)
        return None
    try:
        from mlflow import MlflowClient

        open_sqlite(uri)
        return record(MlflowClient(tracking_uri=uri), root, uri)
    except Exception as e:  # noqa: BLE001 - tracking never fails a check or a study
        log.warning("MLflow tracking disabled: %s: %s", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None


def log_drift_check(project_root: str | Path, summary: Mapping[str, Any], report_dir: str | Path | None, *,
                    experiment: str = DRIFT_EXPERIMENT, tracking_uri: str | None = None) -> str | None:
    """Record one drift check (``monitoring.drift.run_check``) as an MLflow run; return its id.

    Run ``drift-check`` in ``experiment``; tags ``drift.verdict``, ``drift.window_source``,
    ``drift.reference_model_sha256``, ``drift.drifted`` and the git commit; metrics
    ``window.sentences``, ``drifted_share``, ``drift`` (1/0), ``<descriptor>.statistic`` and
    ``<descriptor>.drifted`` per test, ``embeddings.statistic``; the report folder as artifacts
    (``drift/``). Like ``Tracker``, it never fails the caller: an unreachable server or a failing
    call logs one warning ("MLflow tracking disabled: ...") and returns None. ``AIAYN_TRACKING=0``
    turns it off.
    """
    def record(client: Any, root: Path, uri: str) -> str:
        from mlflow.entities import Metric, RunTag

        window = summary.get("window", {})
        tags = git_tags(root) | {
            "aiayn.kind": "drift-check", "drift.verdict": str(summary.get("verdict")),
            "drift.window_source": str(window.get("file") or window.get("log") or ""),
            "drift.reference_model_sha256": str(summary.get("reference", {}).get("model_sha256")),
            "drift.drifted": ",".join(summary.get("drifted", [])) or "none"}
        run = client.create_run(experiment_id(client, uri, experiment), run_name="drift-check", tags=tags)
        now = int(time.time() * 1000)
        values: dict[str, float] = {"window.sentences": float(window.get("sentences", 0))}
        if summary.get("drifted_share") is not None:
            values["drifted_share"] = float(summary["drifted_share"])
            values["drift"] = float(summary.get("verdict") == "drift")
        for name, t in (summary.get("descriptors") or {}).items():
            values[f"{name}.statistic"] = float(t["statistic"])
            values[f"{name}.drifted"] = float(bool(t["drifted"]))
        if summary.get("embeddings"):
            values["embeddings.statistic"] = float(summary["embeddings"]["statistic"])
            values["embeddings.drifted"] = float(bool(summary["embeddings"]["drifted"]))
        client.log_batch(run.info.run_id, metrics=[Metric(BAD_KEY_CHARS.sub("_", k), v, now, 0)
                                                   for k, v in values.items()],
                         tags=[RunTag("mlflow.note.content", f"drift check: {summary.get('verdict')}")])
        if report_dir is not None and Path(report_dir).is_dir():
            client.log_artifacts(run.info.run_id, str(report_dir), "drift")
        client.set_terminated(run.info.run_id, status="FINISHED")
        return run.info.run_id

    return _standalone_run(project_root, tracking_uri, record)


def stage_metrics_by_experiment(project_root: str | Path, exp_names: list[str], stage: str, *,
                                experiment: str = "aiayn", tracking_uri: str | None = None) -> dict[str, dict[str, float]]:
    """The latest values of every metric of ``stage``'s newest run per DVC experiment name.

    Stage runs carry the tag ``dvc.exp_name`` when DVC ran them as an experiment
    (``dvc exp run --queue/--temp`` sets ``DVC_EXP_NAME``). Returns ``{exp_name: {metric: value}}``
    for the names found; ``{}`` when tracking is off or the store cannot be read (one warning).
    """
    if not tracking_enabled(True) or not exp_names:
        return {}
    uri = resolve_tracking_uri(Path(project_root).resolve(), tracking_uri)
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        for name in exp_names:
            runs = client.search_runs([exp.experiment_id],
                                      f"tags.`dvc.exp_name` = '{name}' and tags.`aiayn.stage` = '{stage}'",
                                      order_by=["attributes.start_time DESC"], max_results=1)
            if runs:
                out[name] = dict(runs[0].data.metrics)
        return out
    except Exception as e:  # noqa: BLE001 - a report without these numbers is still a report
        log.warning("MLflow store not readable: %s: %s", type(e).__name__, e)
        return {}


def log_study(project_root: str | Path, name: str, metrics: Mapping[str, float], params: Mapping[str, Any],
              artifacts: str | Path | None, *, experiment: str = "aiayn-studies",
              tracking_uri: str | None = None) -> str | None:
    """Record one study (e.g. the seed-variance report, ``benchmarks/studies/variants_study.py``) as an MLflow run.

    Run ``name`` in ``experiment`` with ``params`` (the budget, seeds, variants), ``metrics``
    (means, standard deviations, ranges) and the files under ``artifacts`` (table, JSON, plot)
    as artifacts ``study/``. Returns the run id, or None when tracking is off or fails (one warning).
    """
    def record(client: Any, root: Path, uri: str) -> str:
        from mlflow.entities import Metric, Param

        run = client.create_run(experiment_id(client, uri, experiment), run_name=name,
                                tags=git_tags(root) | {"aiayn.kind": "study"})
        now = int(time.time() * 1000)
        ms = [Metric(BAD_KEY_CHARS.sub("_", k)[:MAX_KEY_LEN], float(v), now, 0) for k, v in metrics.items()]
        ps = [Param(BAD_KEY_CHARS.sub("_", k)[:MAX_KEY_LEN], param_value(v)) for k, v in params.items()]
        for chunk in chunks(ms, 1000):
            client.log_batch(run.info.run_id, metrics=chunk)
        for chunk in chunks(ps, 100):
            client.log_batch(run.info.run_id, params=chunk)
        if artifacts is not None and Path(artifacts).is_dir():
            client.log_artifacts(run.info.run_id, str(artifacts), "study")
        client.set_terminated(run.info.run_id, status="FINISHED")
        return run.info.run_id

    return _standalone_run(project_root, tracking_uri, record)
