"""``python -m pipelines.run_stage <name> [--params P] [--root DIR] [--mirror DIR]``: one stage as a Prefect flow run.

This is what every ``dvc.yaml`` stage ``cmd`` runs, so a ``dvc repro`` shows up
in Prefect (one flow run per stage). ``<name>`` is a key of
``pipelines.flows.STAGE_FLOWS`` (fetch, corpus, prepare, tokenize, train, evaluate, quantize, export, monitor_reference).

Options: ``--params`` (default ``params.yaml``, relative to ``--root``),
``--root`` (default: the current directory), ``--mirror`` (``fetch`` only; a
local corpus folder, default ``$AIAYN_DATA_MIRROR``).

Exit status: 0 on success; 130 when it was interrupted (Ctrl-C or SIGTERM: one line on
stderr, ``stage <name> interrupted: <message>``, saying where its checkpoint is); 1 when the stage failed, with the stage's own error
message on stderr (``stage <name> failed: <ExceptionType>: <message>``) and, when
``$AIAYN_STAGE_ERROR_FILE`` is set, in that file too (the ``pipeline`` flow reads it
to fail with the stage's message); 2 on bad arguments.

When ``$AIAYN_PIPELINE_RUN_ID`` is set (by the ``pipeline`` flow), the flow run is
tagged ``pipeline-run:<id>`` so the stage runs of one pipeline run group together.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

__all__ = ["main"]


def _parser(stages: list[str] | None) -> argparse.ArgumentParser:
    """The command line; ``stages`` None: a lenient one (any stage word or none, no ``--help``)."""
    p = argparse.ArgumentParser(prog="python -m pipelines.run_stage", description="Run one aiayn stage as a Prefect flow.",
                                add_help=stages is not None, exit_on_error=stages is not None)
    p.add_argument("stage", choices=stages, nargs=None if stages else "?", help="stage to run")
    p.add_argument("--params", default="params.yaml", help="params file, relative to --root (default: params.yaml)")
    p.add_argument("--root", default=".", help="project root (default: current directory)")
    p.add_argument("--mirror", default=None, help="fetch only: local corpus folder (default: $AIAYN_DATA_MIRROR)")
    return p


def _stage_name(argv: list[str]) -> str | None:
    """The stage ``argv`` names (None when it names none), read before anything imports Prefect or torch:
    the process defaults depend on it (``aiayn.config.settings.FP32_STAGES``). A bad command line is the real
    parser's to report: None here."""
    try:
        return _parser(None).parse_known_args(argv)[0].stage
    except argparse.ArgumentError:
        return None


def _failure_message(state) -> str:
    """``"<ExceptionType>: <message>"`` of a failed flow run state (its exception when available)."""
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, BaseException):
        return f"{type(exc).__name__}: {exc}"
    return state.message or f"flow run ended in state {state.type.value}"


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the stage's flow, return the exit status (0 ok, 1 stage failed, 130 interrupted)."""
    from pipelines import apply_project_env

    apply_project_env(_stage_name(sys.argv[1:] if argv is None else argv))  # before Prefect and torch load

    from aiayn.exitcodes import EXIT_INTERRUPTED
    from aiayn.config.settings import Settings
    from pipelines.flows import STAGE_FLOWS  # imports Prefect

    args = _parser(list(STAGE_FLOWS)).parse_args(argv)
    flow = STAGE_FLOWS[args.stage]
    root = str(Path(args.root).resolve())
    kwargs = {"root": root, "mirror": args.mirror} if args.stage == "fetch" else {"params_path": args.params, "root": root}

    from prefect import tags

    settings = Settings.from_env()
    pipeline_run = settings.pipeline_run_id
    try:
        with tags(f"pipeline-run:{pipeline_run}") if pipeline_run else contextlib.nullcontext():
            state = flow(**kwargs, return_state=True)
    except KeyboardInterrupt:  # Ctrl-C outside the stage's own handler (start-up, data loading)
        print(f"stage {args.stage} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if state.is_completed():
        return 0
    if state.is_cancelled():  # the stage stopped on Ctrl-C/SIGTERM after saving its state
        print(f"stage {args.stage} interrupted: {state.message}", file=sys.stderr)
        return EXIT_INTERRUPTED

    message = f"stage {args.stage} failed: {_failure_message(state)}"
    print(message, file=sys.stderr)
    if settings.stage_error_file is not None:
        from aiayn.io import atomic_write_text

        atomic_write_text(settings.stage_error_file, message + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
