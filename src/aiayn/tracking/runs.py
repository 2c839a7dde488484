"""A stage's MLflow run: the recorder a stage is handed (``MlflowRecorder``) and the run it opens (``Tracker``).

A ``Tracker`` is one nested run under the pipeline run (``aiayn.tracking.parent``), shaped by the
stage's ``aiayn.recording.StageRecord``: its headline metrics are also logged on the pipeline run, its
params too when the record says so, its datasets become dataset inputs of both runs, and the
pipeline's last stage ends the pipeline run. Tags on both runs: a ``dvc.yaml`` stage's data version and what it
read (``aiayn.tracking.lineage.stage_tags``, when it starts) and wrote (``stage_data``, when it ends), hashed from the
files; any other run's (the flow's ``orchestrate``), ``lineage_tags`` from ``dvc.lock``.
The run ends ``FINISHED``, ``FAILED`` (an exception left the ``with`` block; the exception still
propagates) or ``KILLED`` (``KeyboardInterrupt``).

Metrics are buffered and sent in batches (``flush_every`` calls, ``flush_seconds`` since the last
send, and at the end); there is no background thread.

Tracking must never stop training. If the server is unreachable or any MLflow call raises, the run
logs ONE warning on the ``aiayn.tracking`` logger ("MLflow tracking disabled ...: <why>") and every
later call is a no-op. Errors in the *caller's* input (a non-numeric metric, a bad key, a missing
file) still raise ``ValueError``/``FileNotFoundError``, tracking on or off
(``aiayn.recording.check_*``). ``enabled=False`` or ``AIAYN_TRACKING=0`` turns everything into a
no-op.

A *required* run (``required=True``; the stage entry points, ``aiayn <stage>`` and the Prefect stage
flows, ask for one) is never silently missing: a store unreachable when the run starts (after the
probe's bounded tries, ``aiayn.tracking.store``) raises ``TrackingLostError`` at once, with no warning before
it (nothing was disabled: the stage fails), before the work that follows the ``with`` (a stage that records
after writing its outputs, as prepare and export do, has written them; they are not trusted: ``dvc repro``
records nothing and runs it again); a store lost mid-run (MLflow's HTTP client retries twice, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``) lets the
stage finish its work and write its outputs, then raises ``TrackingLostError`` when the ``with`` block
ends, so the stage fails (``dvc repro`` records nothing and runs it again). Its run, left ``RUNNING`` in
the store, is ended as ``KILLED`` by the next stage run that starts (``aiayn.tracking.orphans``).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from aiayn.io import atomic_write_json
from aiayn.recording import StageRecord, check_dir, check_file, check_key, check_metrics, check_params
from aiayn.config.settings import Settings
from aiayn.provenance import CORPUS_STAGE, Digests
from aiayn.tracking.lineage import (
    current_data_version,
    dvc_datasets,
    hash_tags,
    lineage_hashes,
    lineage_tags,
    stage_data,
    stage_tags,
)
from aiayn.tracking.orphans import PROCESS_TAG, end_orphaned_runs, process_tag
from aiayn.tracking.parent import DESCRIPTION_TAG, STATE_FILE, describe_pipeline, finish_parent, resolve_parent
from aiayn.tracking.registry import register_translation, register_transformers
from aiayn.tracking.store import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE_LEN,
    chunks,
    experiment_id,
    open_http,
    open_sqlite,
    resolve_tracking_uri,
    tracking_enabled,
)

__all__ = ["Tracker", "MlflowRecorder", "TrackingLostError"]

log = logging.getLogger("aiayn.tracking")


class TrackingLostError(RuntimeError):
    """A required run (``Tracker(required=True)``) could not be started, or lost its store mid-run."""


def mlflow_command() -> str:
    """The ``mlflow`` executable of this interpreter's environment (its full path, e.g. ``.venv/bin/mlflow``),
    or plain ``mlflow`` when there is none beside it."""
    here = Path(sys.executable).parent / "mlflow"
    return str(here) if here.is_file() else "mlflow"


class MlflowRecorder:
    """The ``aiayn.recording.Recorder`` that records into MLflow: ``start(record)`` opens a ``Tracker``.

    Built where a stage is started (``aiayn <stage>``, the Prefect stage flows) and handed to the
    stage's ``run``. The arguments are ``Tracker``'s; ``settings`` (default: read from the
    environment when a run starts) gives ``AIAYN_TRACKING`` and ``AIAYN_PARENT_RUN_ID``; ``params`` is the
    config the stage runs with (``aiayn <stage> --params FILE``, the flows' ``Params``); ``required``: every run
    it starts is required (module doc).
    """

    def __init__(self, project_root: str | Path, *, experiment: str = "aiayn", tracking_uri: str | None = None,
                 enabled: bool = True, settings: Settings | None = None,
                 params: Mapping[str, Any] | None = None, required: bool = False) -> None:
        self.required = required
        self.project_root = Path(project_root)
        self.params = params
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.enabled = enabled
        self.settings = settings

    def start(self, record: StageRecord) -> Tracker:
        """A ``Tracker`` for ``record`` (its run starts when the ``with`` block is entered)."""
        return Tracker(record, project_root=self.project_root, experiment=self.experiment,
                       tracking_uri=self.tracking_uri, enabled=self.enabled, settings=self.settings, params=self.params,
                       required=self.required)

    def resolve_registered_model(self, uri: str, cache_root: Path) -> dict[str, Any]:
        """The registered version ``uri`` (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``) as a model folder
        under ``cache_root``, for ``train.init_from`` (``aiayn.tracking.registered_parent``); read from this
        recorder's store whether tracking is on or not. Raises ``aiayn.tracking.RegistryError`` (one line)."""
        from aiayn.tracking.registered_parent import resolve_registered_parent

        return resolve_registered_parent(uri, tracking_uri=resolve_tracking_uri(self.project_root, self.tracking_uri),
                                         cache_root=cache_root)


class Tracker:
    """One stage's MLflow run under the pipeline's parent run (see module doc).

    Use as a context manager::

        with Tracker(record, project_root=root) as t:
            t.log_params(params.model_dump(mode="json"))
            for step in ...:
                t.log_metrics({"train/loss": loss, "lr": lr}, step=step)
            t.log_artifacts(layout.model, "model")

    Args:
        record: the stage's ``StageRecord``, or a stage name (a record with no policy).
        project_root: project root (default store, ``dvc.lock``, state file).
        experiment: MLflow experiment name (ignored when ``AIAYN_PARENT_RUN_ID``
            is set: the child joins the parent's experiment).
        tracking_uri: overrides ``MLFLOW_TRACKING_URI`` and the SQLite default.
        enabled: False makes every call a no-op (so does ``AIAYN_TRACKING=0``).
        end_pipeline: end the parent run when this stage ends; default ``record.ends_pipeline``.
        flush_every: buffered ``log_metrics`` calls that trigger a flush.
        flush_seconds: seconds since the last flush that trigger a flush (checked
            on each ``log_metrics`` call; there is no background thread).
        settings: the environment's settings (default: read now).
        params: the config the stage runs with (``Params.model_dump(mode="json")``): it fills ``dvc.yaml``'s
            templates when the run is tagged with what the stage read and wrote (default: ``params.yaml``'s).
        required: the run must be recorded (module doc): ``TrackingLostError`` instead of going on without it.

    Raises:
        ValueError: an invalid stage name, ``flush_every`` < 1 or ``flush_seconds`` < 0.
        TrackingLostError: (``required``) when the ``with`` block is entered or left, the run is not recorded.
    """

    def __init__(
        self,
        record: StageRecord | str,
        *,
        project_root: str | Path,
        experiment: str = "aiayn",
        tracking_uri: str | None = None,
        enabled: bool = True,
        end_pipeline: bool | None = None,
        flush_every: int = 50,
        flush_seconds: float = 10.0,
        settings: Settings | None = None,
        params: Mapping[str, Any] | None = None,
        required: bool = False,
    ) -> None:
        self.record = record if isinstance(record, StageRecord) else StageRecord(record)
        self._required = required
        if flush_every < 1 or flush_seconds < 0:
            raise ValueError(f"flush_every must be >= 1 and flush_seconds >= 0, got {flush_every}, {flush_seconds}")
        self.stage = self.record.stage
        self.project_root = Path(project_root).resolve()
        self.experiment = experiment
        self.tracking_uri = resolve_tracking_uri(self.project_root, tracking_uri)
        self._enabled = tracking_enabled(enabled, settings)
        self._settings = settings
        self._stage_params = params
        self._end_pipeline = self.record.ends_pipeline if end_pipeline is None else end_pipeline
        self._headline = re.compile(self.record.headline_metrics) if self.record.headline_metrics else None
        self._headline_tags = re.compile(self.record.headline_tags) if self.record.headline_tags else None
        self._flush_every = flush_every
        self._flush_seconds = flush_seconds

        self._active = False  # True between a successful enter and exit / first failure
        self._client: Any = None
        self._experiment_id: str | None = None
        self._run_id: str | None = None
        self._parent_run_id: str | None = None
        self._owns_parent = False
        self._dvc_stage = False
        self._digests = Digests()  # each unchanged file of this run's lineage read once (start and end)
        self._parent_params: set[str] = set()
        self._params: dict[str, str] = {}
        self._buffer: list[Any] = []  # (run id, mlflow.entities.Metric)
        self._calls_since_flush = 0
        self._last_flush = time.monotonic()
        self._warned = False
        self._why: str | None = None

    # ----------------------------------------------------------------- properties

    @property
    def active(self) -> bool:
        """True while the tracker is logging (entered, enabled, no MLflow failure yet)."""
        return self._active

    @property
    def run_id(self) -> str | None:
        """The stage's child run id (None when disabled)."""
        return self._run_id if self._active else None

    @property
    def parent_run_id(self) -> str | None:
        """The pipeline's parent run id (None when disabled)."""
        return self._parent_run_id if self._active else None

    @property
    def disabled_reason(self) -> str | None:
        """Why tracking turned itself off (unreachable store, an MLflow call that raised); None while it
        works, and when it was off from the start (``enabled=False``, ``AIAYN_TRACKING=0``)."""
        return self._why

    @property
    def state_path(self) -> Path:
        return self.project_root / STATE_FILE

    def run_url(self, *, parent: bool = False) -> str | None:
        """Where to look at this run (``parent=True``: its pipeline run): the UI link
        for an ``http(s)`` tracking URI, else a ``<venv>/bin/mlflow ui --backend-store-uri ...``
        command (the ``mlflow`` beside this interpreter, so it runs from a shell without the venv on
        ``PATH``). None when disabled."""
        if not self._active:
            return None
        run_id = self._parent_run_id if parent else self._run_id
        if self.tracking_uri.startswith(("http://", "https://")):
            base = self.tracking_uri.rstrip("/")
            return f"{base}/#/experiments/{self._experiment_id}/runs/{run_id}"
        return (
            f"{mlflow_command()} ui --backend-store-uri {self.tracking_uri}  "
            f"(experiment {self._experiment_id}, run {run_id})"
        )

    def parent_run_url(self) -> str | None:
        """``run_url`` of the pipeline (parent) run."""
        return self.run_url(parent=True)

    # ----------------------------------------------------------------- failure

    def _disable(self, why: str) -> None:
        self._active = False
        self._buffer.clear()
        self._why = self._why or why
        if not self._warned:
            self._warned = True
            if self._required:  # the stage will fail when its run ends (``__exit__``): say so, not "disabled"
                log.warning("MLflow run of stage %r lost: %s; the stage finishes its work, then fails", self.stage, why)
            else:
                log.warning("MLflow tracking disabled for stage %r: %s", self.stage, why)

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run an MLflow call; on any exception disable tracking (one warning) and return None."""
        if not self._active:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - tracking must never stop training
            self._disable(f"{type(e).__name__}: {e}")
            return None

    # ----------------------------------------------------------------- enter / exit

    def __enter__(self) -> Tracker:
        if not self._enabled:
            return self
        why = open_http(self.tracking_uri)
        if why and self._required:  # the error below is the one message
            self._why = why
        elif why:
            self._disable(why)
        else:
            self._active = True
            self._warned = self._required  # a run that cannot start fails at once, below: no warning first
            self._guard(self._start)
            self._warned = False
        if self._required and self._why:
            raise TrackingLostError(f"stage {self.stage}: its MLflow run could not be started in {self.tracking_uri} "
                                    f"({self._why}); the stage fails unrecorded (rerun it once the store answers; "
                                    "AIAYN_TRACKING=0 runs it untracked)")
        return self

    def _start(self) -> None:
        from mlflow import MlflowClient

        open_sqlite(self.tracking_uri)
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        hashes = lineage_hashes(self.project_root)
        reads = stage_data(self.project_root, self.stage, side="deps", params=self._stage_params,
                           digests=self._digests)
        self._dvc_stage = reads is not None  # a dvc.yaml stage: its runs' hashes are what it read and wrote, now
        if reads is None:  # not a dvc.yaml stage (the flow's orchestrate): the lock's lineage
            tags = lineage_tags(self.project_root, hashes)
        else:  # dvc.lock is a run behind for this stage, later ones, and all of them outside `dvc repro`
            tags = stage_tags(self.project_root, self.stage, reads, self._stage_params, self._digests)
            hashes = {**hashes, **reads}
        env_parent = (self._settings or Settings.from_env()).parent_run_id
        state: dict[str, Any] | None = None
        if env_parent:
            parent = self._client.get_run(env_parent)  # raises if missing -> disabled
            self._experiment_id = parent.info.experiment_id
            self._parent_run_id = env_parent
            self._owns_parent = False
        else:
            self._experiment_id = experiment_id(self._client, self.tracking_uri, self.experiment)
            state = resolve_parent(self._client, self.state_path, tracking_uri=self.tracking_uri,
                                   experiment_id=self._experiment_id, stage=self.stage)
            self._parent_run_id = state["run_id"]
            self._owns_parent = True
        self._set_tags(self._parent_run_id, tags)
        self._parent_params = set(self._client.get_run(self._parent_run_id).data.params)
        end_orphaned_runs(self._client, self._experiment_id)  # runs of stages killed outright (kill -9)
        run = self._client.create_run(
            self._experiment_id,
            run_name=self.stage,
            tags={"mlflow.parentRunId": self._parent_run_id, "aiayn.stage": self.stage, "aiayn.kind": "stage",
                  PROCESS_TAG: process_tag()},
        )
        self._run_id = run.info.run_id
        self._set_tags(self._run_id, tags)
        self._log_datasets()
        self._log_hashes(hashes)
        if state is not None:
            state["stages"][self.stage] = {"run_id": self._run_id, "status": "RUNNING"}
            atomic_write_json(self.state_path, state)

    def refresh_lineage(self) -> None:
        """Re-read the lineage (``lineage_tags``, ``lineage/dvc_hashes.json``) and re-tag this run and the parent.

        For a run that wraps ``dvc repro`` (the pipeline flow's ``orchestrate``): its tags were read when it
        started, from the ``dvc.lock`` of the run before (a fresh clone's: the main job's corpus), and the
        stages rewrote it since. A failure disables tracking with one warning, as any MLflow call's (``_guard``)."""
        if self._active:
            self._guard(self._tag_lineage)

    def _tag_lineage(self) -> None:
        hashes = lineage_hashes(self.project_root)
        tags = lineage_tags(self.project_root, hashes)
        for run_id in (self._parent_run_id, self._run_id):
            self._set_tags(run_id, tags)
        self._log_hashes(hashes)

    def _tag_writes(self) -> None:
        """Tag this run and the pipeline run with the DVC hashes of what the stage wrote (``stage_data``), which
        ``dvc.lock`` records only after the stage ends (under ``dvc repro``), and log ``lineage/dvc_hashes.json``:
        the lock's hashes overlaid with every ``data_hash`` the pipeline run's stages have tagged it with. The corpus
        stage of a hub dataset also names its snapshot as the data version, once written."""
        wrote = stage_data(self.project_root, self.stage, side="outs", params=self._stage_params,
                           digests=self._digests) or {}
        tags = hash_tags(wrote)
        if self.stage == CORPUS_STAGE and (version := current_data_version(
                self.project_root, self._stage_params, digests=self._digests)):
            tags["data.version"] = version
        for run_id in (self._run_id, self._parent_run_id):
            self._set_tags(run_id, tags)
        tagged = self._client.get_run(self._parent_run_id).data.tags
        fresh = {k.removeprefix("data_hash."): v for k, v in tagged.items() if k.startswith("data_hash.")}
        self._log_hashes({**lineage_hashes(self.project_root), **fresh})

    def _log_datasets(self) -> None:
        """Log the record's datasets (``lineage.dvc_datasets``) as dataset inputs of the child and the
        parent run (a failure here is one warning; tracking goes on)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        try:
            found = dvc_datasets(self.project_root, self.record.datasets, source_data=self.record.source_data,
                                 params=self._stage_params, digests=self._digests)
            inputs = [DatasetInput(Dataset(d["name"], d["digest"], "dvc", d["source"], profile=d["profile"]),
                                   tags=[InputTag("mlflow.data.context", d["context"])]) for d in found]
            for run_id in (self._run_id, self._parent_run_id) if inputs else ():
                self._client.log_inputs(run_id, datasets=inputs)
        except Exception as e:  # noqa: BLE001 - dataset inputs are a view, never a reason to stop tracking
            log.warning("dataset inputs not logged: %s: %s", type(e).__name__, e)

    def _log_hashes(self, hashes: Mapping[str, str]) -> None:
        """Every DVC hash of the project (code and data) as ONE artifact of the pipeline run,
        ``lineage/dvc_hashes.json`` (the tags keep only the data's)."""
        import json
        import tempfile

        if not hashes:
            return
        try:
            with tempfile.TemporaryDirectory() as tmp:
                f = Path(tmp) / "dvc_hashes.json"
                f.write_text(json.dumps(dict(sorted(hashes.items())), indent=2) + "\n", encoding="utf-8")
                self._client.log_artifact(self._parent_run_id, str(f), "lineage")
        except Exception as e:  # noqa: BLE001 - lineage is a view, never a reason to stop tracking
            log.warning("lineage/dvc_hashes.json not logged: %s: %s", type(e).__name__, e)

    def _describe_parent(self) -> None:
        """(Re)write the pipeline run's description from its headline metrics and tags (``describe_pipeline``)."""
        try:
            parent = self._client.get_run(self._parent_run_id)
            text = describe_pipeline(dict(parent.data.metrics), dict(parent.data.tags))
            self._client.set_tag(self._parent_run_id, DESCRIPTION_TAG, text[:MAX_TAG_VALUE_LEN])
        except Exception as e:  # noqa: BLE001 - a description is a view, never a reason to leave runs open
            log.warning("pipeline run description not written: %s: %s", type(e).__name__, e)

    def _set_tags(self, run_id: str | None, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:MAX_TAG_VALUE_LEN]) for k, v in tags.items()]
        for chunk in chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, tags=chunk)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._active:
            self.flush()
            if exc_type is None:
                status = "FINISHED"
            elif issubclass(exc_type, KeyboardInterrupt):
                status = "KILLED"
            else:
                status = "FAILED"
            self._guard(self._finish, status)
            self._active = False
        if self._required and self._why and exc_type is None:
            raise TrackingLostError(f"stage {self.stage}: its MLflow run {self._run_id} in {self.tracking_uri} is "
                                    f"incomplete ({self._why}); its outputs are written, but the stage fails so that "
                                    "it runs again (rerun it once the store answers; AIAYN_TRACKING=0 runs it untracked)")
        return False  # never swallow the caller's exception

    def _finish(self, status: str) -> None:
        if status == "FINISHED" and self._dvc_stage:
            self._tag_writes()
        self._describe_parent()
        self._client.set_terminated(self._run_id, status=status)
        if self._owns_parent:
            finish_parent(self._client, self.state_path, parent_run_id=self._parent_run_id, stage=self.stage,
                          run_id=self._run_id, status=status, end=self._end_pipeline)

    # ----------------------------------------------------------------- logging

    def log_params(self, params: Mapping[str, Any] | Any, *, parent: bool | None = None) -> None:
        """Log (nested) params on the child run, flattened to ``a.b.c`` keys.

        Values are stringified (lists/tuples as JSON) and cut to MLflow's 6000
        characters. A pydantic model is accepted (``model_dump(mode="json")``).
        With ``parent`` (default: the record's ``params_on_parent``) they are also
        logged on the parent, skipping keys the parent already has (params are
        immutable in MLflow; the first stage to log a key wins there).

        Raises:
            ValueError: a key MLflow would reject (quoted), or a key logged
                twice on this run with a different value.
        """
        flat = check_params(params)
        new: dict[str, str] = {}
        for k, v in flat.items():
            if k in self._params and self._params[k] != v:
                raise ValueError(f"param {k!r} already logged as {self._params[k]!r}, now {v!r}")
            if k not in self._params:
                new[k] = v
        if not self._active or not new:
            return
        self._params.update(new)
        if parent is None:
            parent = self.record.params_on_parent
        self._guard(self._log_params, self._run_id, new)
        if parent and self._active:
            fresh = {k: v for k, v in new.items() if k not in self._parent_params}
            self._parent_params.update(fresh)
            self._guard(self._log_params, self._parent_run_id, fresh)

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for chunk in chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int, *, parent: bool = False) -> None:
        """Buffer ``metrics`` at ``step`` (timestamped now); flushed in batches.

        ``step`` may be passed positionally, so ``log_metrics`` fits the
        trainer's ``on_metrics(metrics, step)`` callback directly.

        A flush (one ``MlflowClient.log_batch`` per 1000 metrics) happens every
        ``flush_every`` calls, when ``flush_seconds`` have passed since the last
        flush, and on exit. ``parent=True`` also logs them on the parent run;
        the record's ``headline_metrics`` always go there too, so pipeline runs
        compare on one row each.

        Raises:
            ValueError: a bad key, a value that is not a real number, or a
                negative / non-integer ``step`` (all quoted).
        """
        values, step = check_metrics(metrics, step)
        if not self._active:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)  # milliseconds
        self._buffer.extend((self._run_id, Metric(k, v, ts, step)) for k, v in values.items())
        headline = self._headline
        to_parent = values if parent else {k: v for k, v in values.items() if headline and headline.match(k)}
        self._buffer.extend((self._parent_run_id, Metric(k, v, ts, step)) for k, v in to_parent.items())
        self._calls_since_flush += 1
        if self._calls_since_flush >= self._flush_every or time.monotonic() - self._last_flush >= self._flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Send buffered metrics now (no-op when nothing is buffered or tracking is off)."""
        self._calls_since_flush = 0
        self._last_flush = time.monotonic()
        if not self._active or not self._buffer:
            return
        buffer, self._buffer = self._buffer, []
        for run_id in dict.fromkeys(r for r, _ in buffer):
            items = [m for r, m in buffer if r == run_id]
            for chunk in chunks(items, MAX_METRICS_PER_BATCH):
                self._guard(self._client.log_batch, run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags on the child run (values stringified, cut to 8000 characters); the record's
        ``headline_tags`` also on the pipeline run.

        Raises:
            ValueError: a key MLflow would reject (quoted).
        """
        checked = {check_key(k, "tag"): v for k, v in tags.items()}
        if self._active:
            self._guard(self._set_tags, self._run_id, checked)
            headline = {k: v for k, v in checked.items() if self._headline_tags and self._headline_tags.match(k)}
            if headline and self._active:
                self._guard(self._set_tags, self._parent_run_id, headline)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload one file to the child run's artifacts (under ``artifact_path``).

        Raises:
            FileNotFoundError: ``path`` is not a file.
        """
        check_file(path)
        if self._active:
            self._guard(self._client.log_artifact, self._run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Upload a directory's contents to the child run's artifacts.

        Raises:
            FileNotFoundError: ``directory`` is not a directory.
        """
        check_dir(directory)
        if self._active:
            self._guard(self._client.log_artifacts, self._run_id, str(directory), artifact_path)

    def register_translation_model(
        self, bundle_dir: str | Path, *, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
        predictor: type, tags: Mapping[str, Any] | None = None, if_absent: bool = False,
    ) -> dict[str, Any] | None:
        """Log a serving bundle on this run as an MLflow pyfunc model (``serving_model``), register a
        version of ``name`` and give it an alias by ``registry.choose_alias`` (``registry.register_translation``).

        ``predictor``: the class the pyfunc model runs (``aiayn.inference.load.BundlePredictor``: built from the
        bundle folder, ``parse(model_input)`` and ``translate(sentences)``). ``if_absent``: register only
        a bundle no version of ``name`` holds yet (``registry.register_translation``). Returns
        ``{"version", "alias", "champion_bleu_before"}``, or None when tracking is off or MLflow failed
        (one warning, the pipeline goes on; the bundle on disk is unaffected; ``disabled_reason`` says why).
        """
        if not self._active:
            return None
        return self._guard(register_translation, self._client, tracking_uri=self.tracking_uri,
                           experiment_id=self._experiment_id, run_id=self._run_id,
                           parent_run_id=self._parent_run_id, bundle=Path(bundle_dir), name=name, variant=variant,
                           gate_split=gate_split, bleu=float(bleu), example=list(example), predictor=predictor,
                           tags=dict(tags or {}), if_absent=if_absent)

    def register_transformers_model(self, hf_dir: str | Path, *, name: str, alias: str | None, task: str,
                                    example: list[str]) -> str | None:
        """Register the Hugging Face folder ``hf_dir`` with MLflow's ``transformers`` flavor as a version of
        ``name`` with ``alias`` (``registry.register_transformers``). Returns the version, or None when
        tracking is off or MLflow failed (one warning; the bundle and its own version are unaffected).
        Raises ``FileNotFoundError`` when ``hf_dir`` has no ``config.json``."""
        check_file(Path(hf_dir) / "config.json", "register_transformers_model")
        if not self._active:
            return None
        return self._guard(register_transformers, self._client, run_id=self._run_id, hf_dir=Path(hf_dir), name=name,
                           alias=alias, task=task, example=list(example))
