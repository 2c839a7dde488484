"""What a stage records into: the ``Recorder`` it is handed, and the ``StageRecord`` it opens its run with.

A stage never opens its own tracker. Its ``run(params, layout, recorder=NULL_RECORDER)`` opens one
run per call with ``with recorder.start(record) as run:`` and logs params, per-step metrics, tags,
artifacts (and, for export, the serving bundle) into ``run``. Whoever starts the stage picks the
recorder: ``aiayn <stage>`` and the Prefect stage flows hand in MLflow's
(``aiayn.tracking.MlflowRecorder``), tests and library callers get ``NullRecorder``, which records
nothing. The model is torchtune's metric logger, handed into a recipe so the recipe runs unchanged
with any logger.

The stage, not the recorder, knows its policy, and says it in its ``StageRecord``: the metrics that
are the pipeline run's headline, whether its params describe the whole pipeline run, the data it
reads, and whether it is the pipeline's last stage.

Every recorder checks the caller's input the same way (MLflow's rules: keys of 1-250 characters from
letters, digits, ``_ - . : /`` and space; real-valued metrics; non-negative integer steps; existing
files), so a stage that passes its tests with ``NullRecorder`` logs the same calls into MLflow.
"""

from __future__ import annotations

import contextlib
import json
import operator
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "DatasetRead",
    "StageRecord",
    "StageRun",
    "Recorder",
    "NullRun",
    "NullRecorder",
    "NULL_RECORDER",
    "check_key",
    "check_metrics",
    "check_params",
    "check_file",
    "check_dir",
    "param_value",
    "MAX_KEY_LEN",
    "BAD_KEY_CHARS",
    "MAX_PARAM_VALUE_LEN",
]

# MLflow 3.17 limits (mlflow/utils/validation.py).
MAX_KEY_LEN = 250  # characters, param/metric/tag keys
MAX_PARAM_VALUE_LEN = 6000  # characters
_KEY_RE = re.compile(r"^[/\w.\- :]*$")  # MLflow's allowed key characters (POSIX)
#: A character MLflow refuses in a key (recorders replace them in keys they build from data).
BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


@dataclass(frozen=True)
class DatasetRead:
    """A file a stage reads, as a dataset input of its run: ``path`` is POSIX, relative to the
    project root; ``context`` is MLflow's ``mlflow.data.context`` tag (``training``, ``test``...)."""

    path: str
    context: str


@dataclass(frozen=True)
class StageRecord:
    """How one stage's run is recorded; the stage builds it and hands it to ``Recorder.start``.

    Args:
        stage: the run's name and its ``aiayn.stage`` tag (MLflow key characters).
        headline_metrics: regular expression (``re.match``) of the metric names also logged on the
            pipeline (parent) run, so pipeline runs compare on one row each; None: none.
        headline_tags: the same for tag keys (e.g. how training stopped): also set on the pipeline run,
            whose description (``mlflow.note.content``) they and the headline metrics make up.
        params_on_parent: the stage's params are also the pipeline run's (the first stage to log a
            key there wins: MLflow params are immutable).
        source_data: the DVC-tracked raw data (each top-level ``*.dvc`` file's output) is one of
            the stage's dataset inputs.
        datasets: files the stage reads, logged as dataset inputs of its run and the pipeline run.
        ends_pipeline: the stage is the pipeline's last: its end ends the pipeline run it started.

    Raises:
        ValueError: ``stage`` is empty or has characters MLflow refuses in a key, or
            ``headline_metrics`` / ``headline_tags`` is not a valid regular expression.
    """

    stage: str
    headline_metrics: str | None = None
    headline_tags: str | None = None
    params_on_parent: bool = False
    source_data: bool = False
    datasets: tuple[DatasetRead, ...] = ()
    ends_pipeline: bool = False

    def __post_init__(self) -> None:
        if not self.stage or not isinstance(self.stage, str) or not _KEY_RE.match(self.stage):
            raise ValueError(f"invalid stage name {self.stage!r}")
        for name in ("headline_metrics", "headline_tags"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"{name} {pattern!r}: not a regular expression: {e}") from None

    def reading(self, *datasets: DatasetRead) -> StageRecord:
        """This record with ``datasets`` appended (a stage adds the files its params name)."""
        return replace(self, datasets=self.datasets + datasets)


class StageRun(Protocol):
    """One stage's open run: what the stage logs into."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log (nested) params, flattened to ``a.b.c`` keys; raises ``ValueError`` (``check_params``)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step``; raises ``ValueError`` (``check_metrics``)."""

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values stringified); raises ``ValueError`` for a bad key."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Store one file under ``artifact_path``; raises ``FileNotFoundError`` when it is no file."""

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Store a folder's contents; raises ``FileNotFoundError`` when it is no folder."""

    def register_translation_model(
        self, bundle_dir: str | Path, *, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
        predictor: type, tags: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Register the serving bundle as a version of model ``name``; returns
        ``{"version", "alias", "champion_bleu_before"}``, or None when nothing was registered."""

    def register_transformers_model(self, hf_dir: str | Path, *, name: str, alias: str | None, task: str,
                                    example: list[str]) -> str | None:
        """Register a Hugging Face model folder (``aiayn.export.hf_marian``) with MLflow's ``transformers`` flavor
        as a version of ``name`` with ``alias``; returns the version, or None when nothing was registered.
        Raises ``FileNotFoundError`` when ``hf_dir`` has no ``config.json``."""

    def flush(self) -> None:
        """Send what is buffered now."""


class Recorder(Protocol):
    """What a stage is handed: it opens the stage's run. A recorder that can read the model registry also has
    ``resolve_registered_model(uri, cache_root) -> dict`` (``aiayn.tracking.MlflowRecorder``): how the tokenize and
    train stages resolve ``train.init_from: models:/...`` (``aiayn.init_from.Resolver``); the ``NullRecorder`` has
    none, so a stage it is handed continues model folders only."""

    def start(self, record: StageRecord) -> contextlib.AbstractContextManager[StageRun]:
        """A context manager around the stage's work, yielding its ``StageRun``. The run ends with
        the block: finished, failed (an exception left it; the exception propagates) or killed
        (``KeyboardInterrupt``)."""


# --------------------------------------------------------------------------- input checks


def check_key(key: str, what: str) -> str:
    """``key`` if MLflow accepts it as a ``what`` (param/metric/tag) key. Raises ``ValueError`` (quoted)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN or not _KEY_RE.match(key):
        raise ValueError(
            f"invalid MLflow {what} key {key!r}: needs 1..{MAX_KEY_LEN} characters from "
            "letters, digits, '_', '-', '.', ' ', ':', '/'"
        )
    if posixpath.normpath(key) != key:
        raise ValueError(f"invalid MLflow {what} key {key!r}: must be a normalised path (no '//', './', '..')")
    return key


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            flat.update(_flatten(v, f"{key}."))
        else:
            flat[key] = v
    return flat


def param_value(v: Any) -> str:
    """A param value as MLflow stores it: stringified (lists/tuples as JSON), cut to 6000 characters."""
    s = json.dumps(list(v), default=str) if isinstance(v, (list, tuple)) else str(v)
    return s[:MAX_PARAM_VALUE_LEN]


def check_params(params: Mapping[str, Any] | Any) -> dict[str, str]:
    """``params`` (a mapping, nested or not, or a pydantic model) flattened to ``{"a.b.c": value}``
    with ``param_value`` values. Raises ``ValueError``: not a mapping, or a key MLflow would refuse."""
    if hasattr(params, "model_dump"):
        params = params.model_dump(mode="json")
    if not isinstance(params, Mapping):
        raise ValueError(f"log_params expects a mapping, got {type(params).__name__}")
    return {check_key(k, "param"): param_value(v) for k, v in _flatten(params).items()}


def check_metrics(metrics: Mapping[str, float], step: Any) -> tuple[dict[str, float], int]:
    """``(metrics as floats, step as int)``. ``step`` may be any integer scalar (numpy, torch).

    Raises:
        ValueError: a bad key, a value that is not a real number, or a negative / non-integer
            ``step`` (all quoted).
    """
    try:
        step_i = operator.index(step)  # int, numpy or torch integer scalars
    except TypeError:
        step_i = -1
    if isinstance(step, bool) or step_i < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    values: dict[str, float] = {}
    for k, v in metrics.items():
        check_key(k, "metric")
        try:
            values[k] = float(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"metric {k!r} at step {step_i}: not a number: {v!r}") from e
    return values, step_i


def check_file(path: str | Path, what: str = "log_artifact") -> None:
    """Raise ``FileNotFoundError`` unless ``path`` is a file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what}: no such file: {path}")


def check_dir(directory: str | Path, what: str = "log_artifacts") -> None:
    """Raise ``FileNotFoundError`` unless ``directory`` is a folder."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{what}: no such directory: {directory}")


# --------------------------------------------------------------------------- the no-op recorder


class NullRun:
    """A run that records nothing; it checks every call's input like any recorder."""

    def log_params(self, params: Mapping[str, Any] | Any) -> None:
        check_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        check_metrics(metrics, step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k in tags:
            check_key(k, "tag")

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        check_file(path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        check_dir(directory)

    def register_translation_model(
        self, bundle_dir: str | Path, *, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
        predictor: type, tags: Mapping[str, Any] | None = None,
    ) -> None:
        return None

    def register_transformers_model(self, hf_dir: str | Path, *, name: str, alias: str | None, task: str,
                                    example: list[str]) -> None:
        check_file(Path(hf_dir) / "config.json", "register_transformers_model")
        return None

    def flush(self) -> None:
        pass


class NullRecorder:
    """The default recorder of every stage: each run is a ``NullRun``."""

    @contextlib.contextmanager
    def start(self, record: StageRecord) -> Iterator[NullRun]:
        yield NullRun()


#: The shared ``NullRecorder`` (it holds no state).
NULL_RECORDER = NullRecorder()
