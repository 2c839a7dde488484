"""The ``drift-check`` Prefect flow: one drift check on the latest window, as a scheduled job.

``pipelines.deploy`` deploys it hourly (cron, explicit timezone, concurrency limit 1 with new
runs cancelled while one runs, so an outage never leaves a pile of late runs behind). The flow
is a thin wrapper over ``monitoring.drift.run_check``:

- ``no_drift``: the run ends **Completed**;
- ``drift``: the run ends **Failed** with the drifted descriptors in its message: the alert a
  user sees in the Prefect UI and can hook an automation (e-mail, Slack) to;
- ``insufficient_data`` (a quiet hour): **Completed**, its message says so; no verdict either way;
- the check cannot run (no reference, unreadable log, bad config): **Failed** with the reason.

Every run publishes a markdown artifact (key ``aiayn-drift-report``) with the verdict and one
row per test, and logs the reports to MLflow (``aiayn.tracking.log_drift_check``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines import apply_project_env

apply_project_env()  # before Prefect is imported: it reads its settings once

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Completed, Failed  # noqa: E402

from aiayn.config.schema import load_params  # noqa: E402
from aiayn.stages import Layout  # noqa: E402
from pipelines.flows import stage_logs_to_prefect  # noqa: E402

__all__ = ["drift", "render_markdown", "REPORT_KEY"]

#: Key of the markdown artifact (Prefect UI -> Artifacts).
REPORT_KEY = "aiayn-drift-report"


def render_markdown(summary: dict[str, Any], report_dir: str | None) -> str:
    """The Prefect artifact: verdict, window, one table row per descriptor test and the embedding test."""
    lines = [f"# Drift check: **{summary['verdict']}**", ""]
    w = summary["window"]
    src = w.get("file") or w.get("log") or "?"
    lines.append(f"Window: {w['sentences']} sentences from `{src}`; reference: {summary['reference']['sentences']} "
                 f"training sentences ({summary['reference'].get('split')}).")
    if summary.get("reason"):
        lines += ["", summary["reason"]]
    if summary["descriptors"]:
        lines += ["", "| descriptor | test | statistic | threshold | drifted | current mean | reference mean |",
                  "|---|---|---|---|---|---|---|"]
        for name, t in summary["descriptors"].items():
            lines.append(f"| {name} | {t['test']} | {t['statistic']:.4g} | {t['threshold']:g} | "
                         f"{'**yes**' if t['drifted'] else 'no'} | {t['current_mean']:.4g} | {t['reference_mean']:.4g} |")
        lines += ["", f"Drifted share {summary['drifted_share']:.2f} (drift at >= {summary['drift_share']:.2f})."]
    if summary.get("embeddings"):
        e = summary["embeddings"]
        lines += ["", f"Embeddings ({e['dims']}-dim PCA, {e['current_rows']} vs {e['reference_rows']} rows): "
                      f"{e['method']} {e['statistic']:.4g} ({e['test']}): "
                      f"{'**drift**' if e['drifted'] else 'no drift'}."]
    outputs = summary.get("outputs") or {}
    lines += ["", f"Outputs: **{outputs.get('verdict')}** ({outputs.get('answered', 0)} answers)"
              + (f": {outputs['reason']}" if outputs.get("reason") else ".")]
    if outputs.get("signals"):
        lines += ["", "| output signal | flagged | share | in-domain rate | p-value | alarm |", "|---|---|---|---|---|---|"]
        for name, t in outputs["signals"].items():
            lines.append(f"| {name} | {t['flagged']}/{t['n']} | {t['share']:.3f} | {t['expected']:.3f} | "
                         f"{t['p_value']:.3g} | {'**yes**' if t['alarm'] else 'no'} |")
    if report_dir:
        lines += ["", f"Reports: `{report_dir}` (report.html, embeddings.html, outputs.html, summary.json)."]
    return "\n".join(lines) + "\n"


@task(name="drift-check", cache_policy=NO_CACHE, persist_result=False)
def check_task(root: str, params_path: str, input_path: str | None) -> dict[str, Any]:
    """Run ``monitoring.drift.run_check``; returns ``{"summary", "report_dir"}`` or ``{"error"}``."""
    from monitoring.drift import DriftCheckError, run_check

    root_path = Path(root).resolve()
    params = load_params(root_path / params_path)
    try:
        with stage_logs_to_prefect():
            summary, report_dir = run_check(params, Layout(root_path), input_path=input_path)
    except DriftCheckError as e:
        return {"error": str(e)}
    return {"summary": summary, "report_dir": str(report_dir) if report_dir else None}


@flow(name="drift-check", log_prints=True)
def drift(root: str = ".", params_path: str = "params.yaml", input_path: str | None = None) -> Any:
    """Check the latest window of the serving log (or ``input_path``) for drift; Failed on drift."""
    logger = get_run_logger()
    out = check_task(root, params_path, input_path)
    if "error" in out:
        create_markdown_artifact(key=REPORT_KEY, markdown=f"# Drift check could not run\n\n{out['error']}\n",
                                 description="drift check: could not run")
        return Failed(message=f"drift check could not run: {out['error']}")
    summary = out["summary"]
    create_markdown_artifact(key=REPORT_KEY, markdown=render_markdown(summary, out["report_dir"]),
                             description=f"drift check: {summary['verdict']}")
    verdict = summary["verdict"]
    outputs = summary.get("outputs") or {}
    problems = []  # both checks are reported when both alarm: the inputs first, then the answers
    if verdict == "drift":
        problems.append(f"drift in {summary['window']['sentences']} production inputs: "
                        f"{', '.join(summary['drifted'])}")
    if outputs.get("verdict") == "alarm":
        problems.append(f"the served model's answers look broken in {outputs['answered']} answers: "
                        f"{', '.join(outputs['alarms'])} flagged above the in-domain rate")
    if problems:
        message = f"{'; '.join(problems)} (reports: {out['report_dir']})"
        logger.error(message)
        return Failed(message=message)
    if verdict == "insufficient_data":
        return Completed(message=summary.get("reason", "insufficient data"))
    return Completed(message=f"no drift in {summary['window']['sentences']} production inputs")
