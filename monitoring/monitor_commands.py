"""The drift monitor's ``aiayn`` commands: ``aiayn monitor-reference`` (the ``monitor_reference``
stage) and ``aiayn monitor`` (one drift check).

Declared in the ``aiayn.cli.stage_commands`` entry-point group (``pyproject.toml``: the entry point's name is
the command's), so the core CLI (``aiayn.cli.main``) lists them without importing this package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from aiayn.cli.stage_commands import ParamsOpt, RootOpt, setup_logging, stage_command, under_root
from aiayn.config.schema import ConfigError, load_params
from aiayn.stages import Layout

__all__ = ["monitor", "monitor_reference"]

monitor_reference = stage_command(
    "monitor-reference", "monitoring.reference",
    "Build the drift reference from the training source side (artifacts/monitor_reference).")


def monitor(
    input_path: Annotated[Optional[Path], typer.Option("--input", "-i", help="Text file, one sentence per line (default: the latest window of the serving log).")] = None,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    out: Annotated[Optional[Path], typer.Option(help="Report folder (default: `artifacts/drift/<UTC time>`).")] = None,
    track: Annotated[bool, typer.Option(help="Log the check to MLflow.")] = True,
    log_url: Annotated[Optional[str], typer.Option(help="Read the window from this PostgreSQL request log (the one `aiayn serve --log-url` replicas share; default env AIAYN_REQUEST_LOG_URL, else monitor.log_path).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole JSON summary instead of one line per test.")] = False,
) -> None:
    """Check production inputs for drift against the training reference (Evidently).

    Prints the verdict and one line per test (``--json``: the whole summary); reports
    (report.html, embeddings.html, outputs.html, summary.json) go to the report folder. Exit status: 0 no drift, 1 drift, 2 the check could not run (no or empty
    window, fewer sentences than monitor.min_window, missing reference, unreadable log).
    """
    setup_logging()
    from monitoring.drift import DriftCheckError, run_check, summary_exit_code

    try:
        summary, folder = run_check(load_params(under_root(params, root)), Layout(root),
                                    input_path=input_path, out_dir=out, track=track, log_url=log_url)
    except (DriftCheckError, ConfigError) as e:
        typer.echo(f"aiayn monitor: error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        typer.echo(f"{summary['verdict']}: {summary['window']['sentences']} sentences; reports in {folder}")
        for name, t in summary["descriptors"].items():
            typer.echo(f"  {name:18s} {t['test']} {t['statistic']:.4g} (threshold {t['threshold']:g})"
                       f"{'  DRIFT' if t['drifted'] else ''}")
        if summary.get("embeddings"):
            e = summary["embeddings"]
            typer.echo(f"  {'embeddings':18s} {e['method']} {e['statistic']:.4g} ({e['test']})"
                       f"{'  DRIFT' if e['drifted'] else ''}")
        outputs = summary.get("outputs") or {}
        typer.echo(f"outputs: {outputs.get('verdict')} ({outputs.get('answered', 0)} answers)"
                   + (f": {outputs['reason']}" if outputs.get("reason") else ""))
        for name, t in (outputs.get("signals") or {}).items():
            typer.echo(f"  {name:22s} flagged {t['flagged']}/{t['n']} (in-domain rate {t['expected']:.3f}, "
                       f"p {t['p_value']:.3g}){'  ALARM' if t['alarm'] else ''}")
    if summary["verdict"] == "insufficient_data":
        typer.echo(f"aiayn monitor: {summary.get('reason')}", err=True)
    raise typer.Exit(summary_exit_code(summary))
