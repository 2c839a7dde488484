"""What every ``aiayn`` command is built from: logging to stderr, the ``--params``/``--root`` options,
and the command that runs one stage (exit statuses: ``aiayn.exitcodes``).

``aiayn.cli.main`` builds the core's commands from these; a package of the project that adds commands
(the drift monitor's, in ``monitoring``) builds them from the same pieces and declares them in the
``aiayn.cli.stage_commands`` entry-point group (``pyproject.toml``), so the core CLI never imports it.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from aiayn.config.checks import load_checked
from aiayn.exitcodes import EXIT_INTERRUPTED, INPUT_ERRORS
from aiayn.stages import Layout

__all__ = [
    "COMMANDS_GROUP",
    "ParamsOpt",
    "RootOpt",
    "setup_logging",
    "run_stage",
    "stage_command",
    "under_root",
]

#: Entry-point group of the commands that packages of the project add to ``aiayn`` (name = command).
COMMANDS_GROUP = "aiayn.commands"

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read (a relative path: from --root, "
                                                                  "as `python -m pipelines.run_stage` reads it).")]
RootOpt = Annotated[Path, typer.Option("--root", help="Project root (artifacts/ and data/ live under it).")]


class _StderrHandler(logging.StreamHandler):
    """A ``StreamHandler`` on whatever ``sys.stderr`` is when a record is written (not when the
    handler was made), so redirected or replaced stderr streams (tests, notebooks) keep working."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(level: int = logging.INFO) -> None:
    """Log ``aiayn`` messages to stderr (rich formatting on a terminal)."""
    logger = logging.getLogger("aiayn")
    logger.setLevel(level)  # every command sets its own level, also when an earlier one (same process) set up
    if logger.handlers:
        return
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False)
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def under_root(params_path: Path, root: Path) -> Path:
    """``--params`` as the stage commands read it: a relative path is taken from ``--root`` (so
    ``aiayn corpus --root ../proj`` reads ``../proj/params.yaml``, as ``python -m pipelines.run_stage`` does)."""
    return params_path if params_path.is_absolute() else Path(root) / params_path


def run_stage(module: str, params_path: Path, root: Path) -> dict:
    """Load and check params (``aiayn.config.checks.load_checked``: ``ConfigError`` listing every problem) and
    run the stage ``module`` (its ``run(params, layout, recorder)``) with the MLflow recorder of ``root``;
    returns its summary."""
    setup_logging()
    from aiayn.config.settings import Settings
    from aiayn.tracking import MlflowRecorder

    params = load_checked(under_root(params_path, root), root)  # every problem (`aiayn check`), before the stage runs
    stage = importlib.import_module(module)
    recorder = MlflowRecorder(root, settings=Settings.from_env(), params=params.model_dump(mode="json"), required=True)
    return stage.run(params, Layout(root), recorder=recorder)


def stage_command(name: str, module: str, doc: str) -> Callable[..., None]:
    """The typer command ``aiayn <name>``: run the stage ``module`` (``run_stage``) and print its summary
    as JSON. Exit status 0; 130 interrupted (the train loop saved a checkpoint, or Ctrl-C elsewhere);
    2 bad params, a missing input or a bad value; 1 its MLflow run could not be recorded (one line on stderr)."""

    def command(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
        from aiayn.tracking.runs import TrackingLostError

        try:
            summary = run_stage(module, params, root)
        except InterruptedError as e:  # the train loop caught SIGINT/SIGTERM and wrote a checkpoint
            typer.echo(f"aiayn {name}: {e}", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except KeyboardInterrupt:  # Ctrl-C outside the train loop's own handler (loading, averaging)
            typer.echo(f"aiayn {name}: interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except INPUT_ERRORS as e:
            typer.echo(f"aiayn {name}: error: {e}", err=True)
            raise typer.Exit(2) from e
        except TrackingLostError as e:  # the store unreachable at the start, or lost mid-run
            typer.echo(f"aiayn {name}: error: {e}", err=True)
            raise typer.Exit(1) from e
        typer.echo(json.dumps(summary, indent=2, default=str))

    command.__doc__ = doc
    return command
