"""One Prefect flow per stage: a thin, typed wrapper over ``aiayn.stages.<name>.run``.

Each flow loads ``params.yaml`` (``params_path``, relative to ``root``), builds
the ``Layout`` of ``root`` and calls the stage's ``run`` inside one task, so the
flow run in Prefect carries the stage's logs, its summary and, on failure, the
stage's own error message (the exception propagates: the flow run ends
``Failed`` with ``"<ExceptionType>: <stage message>"``).

Retries: only I/O is retried (``io_task``: fetching the corpus, DVC remote
transfers), with exponential back-off and only for transient errors
(``is_transient``: connection errors, timeouts, HTTP 5xx/429 and the network
``errno`` values). A full disk, a permission error, a missing file or any other
``OSError`` fails at once: retrying cannot fix them, only delay the message. Compute stages (prepare, tokenize, train,
evaluate) are never retried: a failure there is a bug or bad input, and
re-running a 45-minute training would only repeat it. MLflow calls happen in
the MLflow recorder each stage is handed (``aiayn.tracking.MlflowRecorder``), which
bounds its own HTTP retries; its runs are required, so a store that cannot be reached
fails the stage in one line (``TrackingLostError``: before the work when it is down at
the start, after the outputs are written when it is lost mid-run), never a run
silently missing from MLflow.

Partial outputs: every stage writes atomically (``aiayn.io``: files renamed
into place, directories swapped in whole), so a failed stage leaves no output
behind for the next run (``dvc repro``) to pick up.

Stage logs: records of the ``aiayn`` loggers are forwarded to the Prefect run
logger while a stage runs, and ``print`` is captured (``log_prints=True``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines import apply_project_env

apply_project_env()  # before Prefect is imported: it reads its settings once

from prefect import Flow, flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Cancelled, Failed, State  # noqa: E402
from prefect.tasks import exponential_backoff  # noqa: E402

from aiayn.config.checks import load_checked  # noqa: E402
from aiayn.config.schema import Params  # noqa: E402
from aiayn.exitcodes import INPUT_ERRORS  # noqa: E402
from aiayn.retry import is_transient as core_is_transient  # noqa: E402
from aiayn.stages import Layout  # noqa: E402
from pipelines.dag import stage_module  # noqa: E402

__all__ = [
    "TRANSIENT_ERRORS",
    "IO_RETRIES",
    "IO_RETRY_BACKOFF_S",
    "is_transient",
    "io_task",
    "stage_logs_to_prefect",
    "run_stage",
    "fetch_corpus",
    "fetch",
    "corpus",
    "prepare",
    "tokenize",
    "train",
    "evaluate",
    "quantize",
    "export",
    "monitor_reference",
    "STAGE_FLOWS",
]

#: Exception types an ``io_task`` may retry; ``aiayn.retry.is_transient`` then decides for each error.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError,)

#: Retries of an I/O task after its first attempt.
IO_RETRIES = 3
#: First retry delay (seconds); doubled at each retry: 2, 4, 8 s, each +/- 50 % jitter.
IO_RETRY_BACKOFF_S = 2.0

def is_transient(exc: BaseException | None, transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS) -> bool:
    """True when ``exc`` is worth retrying: an instance of ``transient`` that ``aiayn.retry.is_transient``
    does not call permanent (a full disk, a permission error, HTTP 4xx are never retried). A
    caller-given type outside ``OSError`` (e.g. DVC's ``UploadError``) is retried as such."""
    if exc is None or not isinstance(exc, transient):
        return False
    return core_is_transient(exc) if isinstance(exc, OSError) else True


def _retry_condition(transient: tuple[type[BaseException], ...]) -> Callable[..., bool]:
    def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
        """Prefect ``retry_condition_fn``: retry only transient failures."""
        return is_transient(state.result(raise_on_failure=False), transient)

    return retry_if_transient


def io_task(
    fn: Callable[..., Any] | None = None,
    *,
    transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    **task_kwargs: Any,
) -> Any:
    """``@task`` for I/O: ``IO_RETRIES`` retries, exponential back-off, only on ``transient`` errors.

    Usable bare (``@io_task``) or with arguments (``@io_task(name=..., transient=(OSError, X))``).
    """
    options: dict[str, Any] = dict(
        retries=IO_RETRIES,
        retry_delay_seconds=exponential_backoff(backoff_factor=IO_RETRY_BACKOFF_S),
        retry_jitter_factor=0.5,
        retry_condition_fn=_retry_condition(transient),
        cache_policy=NO_CACHE,
        persist_result=False,
    )
    options.update(task_kwargs)
    decorator = task(**options)
    return decorator(fn) if fn is not None else decorator


class _ToRunLogger(logging.Handler):
    """Forward ``logging`` records to a Prefect run logger (shown in the Prefect UI)."""

    def __init__(self, run_logger: logging.LoggerAdapter) -> None:
        super().__init__()
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.run_logger.log(record.levelno, "%s: %s", record.name, record.getMessage())
        except Exception:  # never let logging break a stage
            self.handleError(record)


@contextmanager
def stage_logs_to_prefect(logger_name: str = "aiayn") -> Iterator[None]:
    """While inside, records of ``logger_name`` (INFO and up) go to the current Prefect run log.

    Propagation to the root logger is paused meanwhile, so the run logger's console
    output is the only copy (no duplicate lines); both settings are restored after.
    """
    core = logging.getLogger(logger_name)
    handler = _ToRunLogger(get_run_logger())
    old_level, old_propagate = core.level, core.propagate
    if core.getEffectiveLevel() > logging.INFO:
        core.setLevel(logging.INFO)
    core.addHandler(handler)
    core.propagate = False
    try:
        yield
    finally:
        core.removeHandler(handler)
        core.setLevel(old_level)
        core.propagate = old_propagate


def _no_empty_traceback(record: logging.LogRecord) -> bool:
    """Quiet Prefect's record of a task that returned a ``Failed`` state: logged with ``exc_info=True`` outside any
    ``except`` (``NoneType: None`` under it) and saying what the task's ``Finished in state Failed(...)`` line says
    next, so a bad input's one line would print twice more. The record is dropped unless a retry follows it; any
    other empty ``exc_info`` is cleared."""
    if record.exc_info == (None, None, None):
        record.exc_info = None
        message = record.getMessage()
        if message.startswith("Task run failed with state:") and "Retry" not in message:
            return False
    return True


logging.getLogger("prefect.task_runs").addFilter(_no_empty_traceback)


# --------------------------------------------------------------------------- tasks


@task(name="run-stage", task_run_name="{stage}", cache_policy=NO_CACHE, persist_result=False)
def run_stage(stage: str, params: Params, layout: Layout) -> dict | State:
    """Run the stage's ``run(params, layout, recorder)`` (``pipelines.dag.stage_module``) with the MLflow
    recorder of ``layout.root`` and return its summary (never retried). Bad input (``aiayn.exitcodes.INPUT_ERRORS``:
    a corpus, a value, params) is returned as a ``Failed`` state whose message is
    ``"<Type>: <message>"``, so the task run and its flow fail as ``aiayn <stage>`` does, without Prefect's task and
    flow tracebacks of an error that is not the code's (an interrupted stage returns ``Cancelled`` the same way);
    a bug still raises, with its traceback."""
    from aiayn.config.settings import Settings
    from aiayn.tracking import MlflowRecorder, TrackingLostError

    module = importlib.import_module(stage_module(stage))
    recorder = MlflowRecorder(layout.root, settings=Settings.from_env(), params=params.model_dump(mode="json"),
                              required=True)
    try:
        with stage_logs_to_prefect():
            summary = module.run(params, layout, recorder=recorder)
    except InterruptedError as e:  # Ctrl-C/SIGTERM: the stage saved its state; its one line is the final state's
        return Cancelled(message=str(e))
    except (*INPUT_ERRORS, TrackingLostError) as e:  # bad input (a corpus, a value, params), a store lost: its one
        return Failed(message=f"{type(e).__name__}: {e}")  # line, as `aiayn <stage>` says it (the task run's final state)
    get_run_logger().info("%s summary: %s", stage, summary)
    return summary


@io_task(name="fetch-corpus")
def fetch_corpus(layout: Layout, mirror: str | None = None) -> dict:
    """Copy (mirror) or download the checksum-verified corpus into ``layout.raw``; retried on I/O errors."""
    fetch_stage = importlib.import_module("aiayn.stages.fetch")
    with stage_logs_to_prefect():
        summary = fetch_stage.run(layout, mirror=Path(mirror) if mirror else None)
    get_run_logger().info("fetch summary: %s", summary)
    return summary


def _input_error(stage: str, e: BaseException) -> str:
    """Log a bad input (``INPUT_ERRORS``) in one line and return it as ``"<Type>: <message>"``."""
    line = f"{type(e).__name__}: {e}"
    get_run_logger().error("%s failed: %s", stage, line)
    return line


def _run(stage: str, params_path: str, root: str) -> Any:
    root_path = Path(root).resolve()
    try:
        params = load_checked(root_path / params_path, root_path)  # an absolute params_path stays as is
    except INPUT_ERRORS as e:  # params `aiayn check` refuses: one line, as run_stage says a bad input
        return Failed(message=_input_error(stage, e))
    state = run_stage(stage, params, Layout(root_path), return_state=True)
    if state.is_cancelled():  # interrupted: the stage's one line (where its checkpoint is)
        return Cancelled(message=state.message)
    if state.is_failed():
        outcome = state.result(raise_on_failure=False)
        if isinstance(outcome, BaseException):  # a bug: it propagates with its traceback
            raise outcome
        return Failed(message=state.message)  # bad input: the stage's one line
    return state.result()


# --------------------------------------------------------------------------- flows


@flow(name="fetch", log_prints=True)
def fetch(root: str = ".", mirror: str | None = None) -> dict:
    """Fetch the verified Multi30k corpus into ``<root>/data/multi30k`` (offline: ``mirror`` or ``AIAYN_DATA_MIRROR``)."""
    return fetch_corpus(Layout(Path(root).resolve()), mirror)


@flow(name="corpus", log_prints=True)
def corpus(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Snapshot the configured corpus source for the pair into ``artifacts/corpus`` (checksummed)."""
    return _run("corpus", params_path, root)


@flow(name="prepare", log_prints=True)
def prepare(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Validate, normalise and filter the raw corpus into ``artifacts/prepared``."""
    return _run("prepare", params_path, root)


@flow(name="tokenize", log_prints=True)
def tokenize(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Train the joint sentencepiece model and encode every split into ``artifacts/tokenized``."""
    return _run("tokenize", params_path, root)


@flow(name="train", log_prints=True)
def train(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Train the Transformer and write the model ``train.select`` chose (validated) into ``artifacts/model``."""
    return _run("train", params_path, root)


@flow(name="evaluate", log_prints=True)
def evaluate(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Decode every test set and score it (sacreBLEU BLEU/chrF) into ``artifacts/eval``."""
    return _run("evaluate", params_path, root)


@flow(name="quantize", log_prints=True)
def quantize(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Build, evaluate and gate the quantized variants (CTranslate2 int8/int16, torchao on GPU) into ``artifacts/quantized``."""
    return _run("quantize", params_path, root)


@flow(name="export", log_prints=True)
def export(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Build the serving bundle (``artifacts/export``) and register it in the MLflow Model Registry."""
    return _run("export", params_path, root)


@flow(name="monitor_reference", log_prints=True)
def monitor_reference(params_path: str = "params.yaml", root: str = ".") -> dict:
    """Describe and embed the training source side: the drift monitor's reference (``artifacts/monitor_reference``)."""
    return _run("monitor_reference", params_path, root)


#: Stage name -> its flow, in pipeline order (``fetch`` comes before the DVC DAG).
STAGE_FLOWS: dict[str, Flow[..., dict]] = {
    "fetch": fetch,
    "corpus": corpus,
    "prepare": prepare,
    "tokenize": tokenize,
    "train": train,
    "evaluate": evaluate,
    "quantize": quantize,
    "export": export,
    "monitor_reference": monitor_reference,
}
