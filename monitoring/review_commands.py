"""``aiayn review``: the human review queue's commands (``export``, ``import``, ``stats``; the logic is
``monitoring.review``). Declared in the ``aiayn.commands`` entry-point group like the monitor's.

The log is the one ``aiayn monitor`` reads: ``--log-url``, else ``AIAYN_REQUEST_LOG_URL``, else
``monitor.log_path`` (relative to the project root). Exit status: 0 done, 2 bad input or an unusable
log (one line on stderr; nothing changed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from aiayn.cli.stage_commands import ParamsOpt, RootOpt, under_root
from aiayn.config.schema import ConfigError, load_params
from aiayn.stages import Layout

__all__ = ["review"]

review = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                     help="The human review queue: export flagged answers for a translator, import their verdicts.")

LogUrlOpt = Annotated[Optional[str], typer.Option(help="The PostgreSQL request log (default env AIAYN_REQUEST_LOG_URL, "
                                                       "else monitor.log_path).")]


def _fail(command: str, e: Exception) -> None:
    typer.echo(f"aiayn review {command}: error: {e}", err=True)
    raise typer.Exit(2) from None


def _open_log(params: Path, root: Path, log_url: Optional[str]):
    from aiayn.config.settings import Settings
    from aiayn.serving.request_log import is_url, open_request_log

    log_path = Path(load_params(under_root(params, root)).monitor.log_path)
    target = log_url or Settings.from_env().request_log_url or (
        log_path if log_path.is_absolute() else Path(root) / log_path)
    if not is_url(target) and not Path(target).is_file():
        raise FileNotFoundError(f"no request log at {target}: `aiayn serve` writes it")
    return open_request_log(target)


_ERRORS = (ConfigError, FileNotFoundError, ValueError, RuntimeError)  # ReviewError, RequestLogError among them


@review.command("export")
def export(
    out: Annotated[Path, typer.Option(help="Folder for review.tsv, review.json (Label Studio tasks), label_config.xml.")] = Path("artifacts/review"),
    sample: Annotated[float, typer.Option(help="Share of unflagged answers queued too (calibration).")] = 0.05,
    limit: Annotated[Optional[int], typer.Option(help="Queue at most this many new answers (flagged first).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    log_url: LogUrlOpt = None,
) -> None:
    """Queue flagged answers (output reference thresholds) and a seeded sample of unflagged ones in the
    log's review table; write every pending one for a translator."""
    from monitoring.output_check import load_output_reference
    from monitoring.reference import reference_dir
    from monitoring.review import export_queue

    try:
        reference = load_output_reference(reference_dir(Layout(root)))
        if reference is None:
            raise FileNotFoundError("no output reference: build it with `dvc repro monitor_reference`")
        folder = out if out.is_absolute() else Path(root) / out
        with _open_log(params, root, log_url) as log:
            counts = export_queue(log, reference["thresholds"], folder, sample=sample, seed=seed, limit=limit)
    except _ERRORS as e:
        _fail("export", e)
    typer.echo(f"queued {counts['queued']} ({counts['flagged']} flagged, {counts['sampled']} sampled) of "
               f"{counts['answers']} answers; {counts['already_queued']} already queued; {counts['pending']} "
               f"pending in {folder}/review.tsv, review.json, label_config.xml")


@review.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="A TSV (request_id, idx, verdict, correction[, reviewer]) or a Label Studio JSON export.")],
    reviewer: Annotated[Optional[str], typer.Option(help="Reviewer of rows that name none.")] = None,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    log_url: LogUrlOpt = None,
) -> None:
    """Record verdicts and corrections in the review table; append reviewed pairs to data/reviewed/train.tsv."""
    from monitoring.review import REVIEWED_CORPUS, import_reviews

    try:
        with _open_log(params, root, log_url) as log:
            result = import_reviews(log, file, Path(root) / REVIEWED_CORPUS, reviewer=reviewer)
    except _ERRORS as e:
        _fail("import", e)
    for line in result.duplicates:
        typer.echo(f"duplicate: {line}")
    for line in result.replaced:
        typer.echo(f"updated: {line}")
    typer.echo(f"{result.recorded} recorded, {result.updated} updated, {result.unchanged} unchanged, "
               f"{len(result.duplicates)} duplicate(s); {result.appended} pair(s) appended to {REVIEWED_CORPUS}")


@review.command("stats")
def stats(
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    log_url: LogUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary.")] = False,
) -> None:
    """Per signal: flagged answers judged wrong vs correct (precision); the sampled answers' wrong rate."""
    from monitoring.review import review_stats

    try:
        with _open_log(params, root, log_url) as log:
            s = review_stats(log.review_items())
    except _ERRORS as e:
        _fail("stats", e)
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    typer.echo(f"{s['reviewed']} of {s['queued']} queued answers reviewed")
    for name, t in s["signals"].items():
        p = "-" if t["precision"] is None else f"{t['precision']:.2f}"
        typer.echo(f"  {name:22s} wrong {t['wrong']:4d}  correct {t['correct']:4d}  precision {p}")
    t = s["sample"]
    rate = "-" if t["wrong_rate"] is None else f"{t['wrong_rate']:.2f}"
    typer.echo(f"  {'sample (unflagged)':22s} wrong {t['wrong']:4d}  correct {t['correct']:4d}  wrong rate {rate}")
