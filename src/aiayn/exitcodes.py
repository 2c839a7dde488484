"""Process exit statuses that mean the same thing in every entry point (``aiayn`` CLI, ``pipelines.run_stage``).

Shells report a process killed by signal ``N`` as ``128 + N``; a command that catches the
signal, cleans up (the train loop writes a checkpoint) and exits by itself uses the same
number so that callers (DVC, Prefect, CI scripts) read it alike.
"""

from __future__ import annotations

__all__ = ["EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE", "EXIT_TRAINING_CUT", "CUT_PREFIX", "INPUT_ERRORS",
           "training_was_cut", "cut_warning_markdown"]

#: Exit status after SIGINT / Ctrl-C or SIGTERM was handled (128 + SIGINT = 130), as shells report Ctrl-C.
EXIT_INTERRUPTED = 130
#: Exit status when the reader of standard output went away (128 + SIGPIPE = 141), e.g. ``| head``.
EXIT_BROKEN_PIPE = 141
#: Exit status of a pipeline run that finished every stage but whose training was cut by the clock
#: (``train.max_time_s``) or a signal: its report, metrics and model exist, yet the model is not the
#: configured one, so callers (``make run && ...``, schedulers, CI) must not take it for a success.
EXIT_TRAINING_CUT = 3
#: Errors of the input, not of the code: bad params (``ConfigError``), a missing file, a bad value (``CorpusError``,
#: ``TokenizerError``, ... are ``ValueError``). Every entry point says them in one line without a traceback:
#: ``aiayn <stage>`` (exit 2) and the Prefect stage flows that ``dvc repro`` runs (a failed run, exit 1).
INPUT_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, ValueError)
#: The first word of the train stage's budget line when the run was cut (``aiayn.stages.train.budget_line``:
#: ``CUT by <reason> at step ...``); ``complete: ...`` otherwise.
CUT_PREFIX = "CUT"


def training_was_cut(budget: str | None) -> bool:
    """Whether a train stage's budget line (``None``: none recorded) says the run was cut by the clock or a
    signal: what the model card's first line, the registry's alias, the flow's final state and the exit
    status (``EXIT_TRAINING_CUT``) all go by."""
    return str(budget or "").startswith(CUT_PREFIX)


def cut_warning_markdown(budget: str | None) -> list[str]:
    """The Markdown lines a document about a run opens with when its training was cut (``training_was_cut``):
    ``> **WARNING: training <budget>**`` and a blank line; none otherwise. The model card
    (``aiayn.export.model_card.render_card``) and the pipeline's closing report both open this way."""
    return [f"> **WARNING: training {budget}**", ""] if training_was_cut(budget) else []
