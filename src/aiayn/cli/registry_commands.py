"""``aiayn registry``: the champion history of the registered model (``history``) and the move back
(``rollback``); the logic is ``aiayn.tracking.champion_history``.

The model is ``--name``, else the one the export stage registers (``AIAYN_REGISTERED_MODEL``, else
``aiayn-{src_lang}-{tgt_lang}`` of ``--params``, else of the defaults); the registry is
``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ``<root>/mlflow.db``. Exit status: 0 done, 2 bad
input, an unreachable registry or nothing to roll back to (one line on stderr; nothing changed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from aiayn.cli.stage_commands import ParamsOpt, RootOpt, under_root

__all__ = ["registry"]

registry = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                       help="The champion history of the registered model, and the rollback of its champion.")

NameOpt = Annotated[Optional[str], typer.Option("--name", help="Registered model (default: the export stage's, "
                                                               "AIAYN_REGISTERED_MODEL or aiayn-{src}-{tgt}).")]
TrackingOpt = Annotated[Optional[str], typer.Option(help="MLflow registry (default MLFLOW_TRACKING_URI, else "
                                                         "sqlite:///<root>/mlflow.db).")]
#: How many of an event's metrics the table shows.
TABLE_METRICS = 3


def _target(name: Optional[str], tracking_uri: Optional[str], params: Path, root: Path) -> tuple[str, str]:
    """``(model name, tracking URI)`` by the module doc's defaults; ``ConfigError`` for params that do not load."""
    from aiayn.config.schema import Params, load_params, registered_model_name
    from aiayn.config.settings import Settings
    from aiayn.tracking.store import resolve_tracking_uri

    if name is None:
        path = under_root(params, root)
        data = (load_params(path) if path.is_file() else Params()).data
        name = registered_model_name(data, Settings.from_env().registered_model_override)
    return name, resolve_tracking_uri(Path(root).resolve(), tracking_uri)


def _fail(command: str, e: BaseException) -> None:
    typer.echo(f"aiayn registry {command}: error: {' '.join(str(e).split())}", err=True)
    raise typer.Exit(2) from None


def _metrics(event: dict[str, Any]) -> str:
    metrics = event.get("metrics") or {}
    shown = [f"{k}={v:g}" for k, v in list(metrics.items())[:TABLE_METRICS]]
    return " ".join(shown + ([f"(+{len(metrics) - TABLE_METRICS})"] if len(metrics) > TABLE_METRICS else []))


def _rows(events: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(e["time"], e["alias"], f"{e['from_version'] or '-'} -> {e['to_version']}", e["reason"], _metrics(e),
             e["actor"] or "", (e["run_id"] or "")[:12]) for e in events]


_COLUMNS = ("time", "alias", "from -> to", "reason", "metrics", "actor", "run")


@registry.command("history")
def history(
    name: NameOpt = None,
    tracking_uri: TrackingOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON (oldest first).")] = False,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Every move of the model's champion and challenger aliases, oldest first: time, alias, from -> to, reason,
    key metrics, actor, run."""
    from aiayn.tracking.champion_history import history as read_history, open_registry

    try:
        model, uri = _target(name, tracking_uri, params, root)
        events = read_history(open_registry(uri), model, tracking_uri=uri)
    except Exception as e:  # noqa: BLE001 - a bad params file, an unreachable registry: one line
        _fail("history", e)
    if as_json:
        typer.echo(json.dumps(events, indent=2))
        return
    if not events:
        typer.echo(f"{model}: no champion history in {uri}")
        return
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*_COLUMNS, title=f"{model}: champion history")
        for row in _rows(events):
            table.add_row(*row)
        Console().print(table)
    else:  # plain tab-separated lines for a pipe or a file
        for row in [_COLUMNS, *_rows(events)]:
            typer.echo("\t".join(row))


@registry.command("rollback")
def rollback(
    to: Annotated[Optional[str], typer.Option("--to", help="Make this version the champion (default: the "
                                                           "previous champion of the history).")] = None,
    name: NameOpt = None,
    tracking_uri: TrackingOpt = None,
    reason: Annotated[Optional[str], typer.Option(help="Why, as the history records it (default: "
                                                       "rollback: champion version X -> Y).")] = None,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Move the champion alias back to the previous champion (or to --to VERSION) and record it; a service that
    polls the alias serves that version next. Exit status 2 when there is no earlier champion or no such
    version (nothing changed)."""
    from aiayn.tracking.champion_history import open_registry, rollback as roll_back

    try:
        model, uri = _target(name, tracking_uri, params, root)
        event = roll_back(open_registry(uri), model, tracking_uri=uri, to_version=to, reason=reason)
    except Exception as e:  # noqa: BLE001 - nothing to roll back to, a bad version, an unreachable registry: one line
        _fail("rollback", e)
    typer.echo(f"{model}: champion version {event['from_version']} -> {event['to_version']} ({event['reason']})")
