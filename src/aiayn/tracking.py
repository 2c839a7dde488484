"""MLflow tracking: one parent run per pipeline run, one nested child run per stage.

This is the only module in ``aiayn`` that imports ``mlflow``, and it does so
lazily (inside functions), so ``import aiayn.tracking`` stays cheap. It also holds
the model registry side: the serving bundle as a pyfunc model
(``Tracker.register_translation_model``), the champion/challenger alias rule
(``choose_alias``) and what ``aiayn serve`` needs to find and download a version.
It never imports ``aiayn.export`` (every stage imports this module, and DVC's
dependency lists follow imports): the export stage passes the bundle's predictor in.

Where runs go
-------------
Tracking URI, first match wins: the ``tracking_uri`` argument, the
``MLFLOW_TRACKING_URI`` environment variable, else a SQLite store inside the
project, ``sqlite:///<project_root>/mlflow.db``. For any ``sqlite:`` URI the
experiment's artifacts go to ``mlruns/<experiment>`` beside the database file
(without this MLflow would put them in ``./mlruns`` of the *current working
directory*). Other stores (Postgres, an ``http(s)`` MLflow server) choose their
own artifact location. A plain file store is refused by MLflow 3.17 unless
``MLFLOW_ALLOW_FILE_STORE=true``; we never use it.

Which pipeline run a stage joins (the parent rule)
--------------------------------------------------
1. ``AIAYN_PARENT_RUN_ID`` set: that run is the parent (an orchestrator such as
   a Prefect flow made it and owns it: the tracker never ends it).
2. Otherwise ``<project_root>/.aiayn/pipeline_run.json`` (local state, tracked
   by neither git nor DVC) names the current parent. It is reused when it was
   made for the same tracking URI and experiment, is still ``RUNNING``, and has
   no child for this stage yet. Else a fresh parent is started, and a recorded
   parent that is still running is ended as superseded (``FAILED`` if one of
   its stages failed or died, else ``FINISHED``). So
   ``prepare -> tokenize -> train -> evaluate -> quantize -> export`` share one parent, and running a
   stage a second time starts a new pipeline run.
3. The last stage of the pipeline (``aiayn.stages.STAGES[-1]``, ``export``
   today; override with ``end_pipeline=``) ends the parent with its own status
   and deletes the state file. ``end_pipeline_run()`` ends it explicitly.

The child run ends ``FINISHED``, ``FAILED`` (an exception left the ``with``
block; the exception still propagates) or ``KILLED`` (``KeyboardInterrupt``).

Tags on parent and child: ``git.commit``, ``git.dirty``,
``mlflow.source.git.commit`` and one ``data_hash.<path>`` per DVC-tracked path
(from ``dvc.lock`` and the project's ``*.dvc`` files).

Failure behaviour
-----------------
Tracking must never stop training. If the server is unreachable or any MLflow
call raises, the tracker logs ONE warning on the ``aiayn.tracking`` logger
("MLflow tracking disabled: <why>") and every later call is a no-op. Errors in
the *caller's* input (a non-numeric metric, a bad key, a missing file) still
raise ``ValueError``/``FileNotFoundError``, enabled or not. For ``http(s)`` URIs
the server's ``/health`` is probed first (2 s timeout), and unless already set
we default ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=2`` and
``MLFLOW_HTTP_REQUEST_TIMEOUT=30`` (MLflow's own defaults, 7 retries and 120 s,
would stall training for minutes on an outage).

``enabled=False`` or ``AIAYN_TRACKING=0`` turns everything into a no-op.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import posixpath
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from aiayn.io import atomic_write_json

__all__ = [
    "Tracker",
    "log_drift_check",
    "DRIFT_EXPERIMENT",
    "end_pipeline_run",
    "dvc_data_hashes",
    "dvc_datasets",
    "git_commit",
    "resolve_tracking_uri",
    "tracking_enabled",
    "STATE_FILE",
]

log = logging.getLogger(__name__)

#: Pipeline state, relative to the project root (not under artifacts/: untracked by DVC).
STATE_FILE = Path(".aiayn") / "pipeline_run.json"

# MLflow 3.17 limits (mlflow/utils/validation.py).
_MAX_KEY_LEN = 250  # characters, param/metric/tag keys
_MAX_PARAM_VAL_LEN = 6000  # characters
_MAX_TAG_VAL_LEN = 8000  # characters
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_KEY_RE = re.compile(r"^[/\w.\- :]*$")  # MLflow's allowed key characters (POSIX)
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")

#: MLflow 3's experiment kind (read by its UI; values from the UI's ExperimentKind enum): without
#: it, an experiment opens on the GenAI "traces" overview instead of the runs table.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"

#: Child-run metrics that are also logged on the pipeline (parent) run, by stage, so the runs table
#: compares pipeline runs on one row each: BLEU/chrF per test set, the validation loss.
HEADLINE_METRICS = {
    "evaluate": re.compile(r"^[\w-]+\.(bleu|chrf)$"),
    "train": re.compile(r"^(averaged_)?valid_(loss|ppl)$"),
}

_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_HEALTH_TIMEOUT_S = 2.0


# --------------------------------------------------------------------------- helpers


def tracking_enabled(enabled: bool = True) -> bool:
    """``enabled`` unless env ``AIAYN_TRACKING`` is ``0``/``false``/``off``/``no``."""
    flag = os.environ.get("AIAYN_TRACKING", "1").strip().lower()
    return enabled and flag not in {"0", "false", "off", "no"}


def resolve_tracking_uri(project_root: str | Path, tracking_uri: str | None = None) -> str:
    """The tracking URI: ``tracking_uri``, else env ``MLFLOW_TRACKING_URI``, else
    ``sqlite:///<project>/mlflow.db`` (absolute). ``<project>`` is ``project_root``, except inside a
    DVC experiment copy (``dvc exp run --temp`` / ``--queue`` run the stages in a copy under
    ``<project>/.dvc/tmp/``, which DVC deletes afterwards): there it is the project DVC names in the
    stage's ``DVC_ROOT``, so the runs land in the project's store."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path(project_root).resolve()
    dvc_root = os.environ.get("DVC_ROOT")
    if dvc_root and root.is_relative_to(Path(dvc_root).resolve() / ".dvc" / "tmp"):
        root = Path(dvc_root).resolve()
    return f"sqlite:///{(root / 'mlflow.db').as_posix()}"


def _open_sqlite(tracking_uri: str) -> None:
    """Create (and migrate) a SQLite store once, under an exclusive file lock beside the database.

    Stage processes that start together on a fresh store (queued DVC experiments) otherwise race in
    MLflow's table creation, and the losers fail ("table ... already exists"). No-op for other URIs.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return
    import fcntl

    from mlflow import MlflowClient

    db = Path(tracking_uri[len("sqlite:///"):].split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            client.search_experiments(max_results=1)  # the tracking store: tables + migrations
            client.search_registered_models(max_results=1)  # the registry store, same database
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sqlite_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """``<db dir>/mlruns/<experiment>`` for a ``sqlite:`` URI, else ``None`` (store decides)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db_path = tracking_uri[len("sqlite:///") :].split("?", 1)[0]
    if db_path in ("", ":memory:"):
        return None
    safe = re.sub(r"[^\w.-]", "_", experiment)
    return (Path(db_path).resolve().parent / "mlruns" / safe).as_uri()


def git_commit(project_root: str | Path) -> tuple[str | None, bool]:
    """``(HEAD commit sha, dirty)`` of the git work tree holding ``project_root``.

    ``dirty`` is True when tracked files differ from HEAD (untracked files are
    ignored: they are not part of any commit). ``(None, False)`` outside a git
    work tree or without a ``git`` executable. Never raises.
    """

    def _git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(project_root), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = _git("rev-parse", "--verify", "HEAD")
    if head is None:
        return None, False
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), bool(status and status.strip())


def _out_hash(entry: Mapping[str, Any]) -> str | None:
    for key in ("md5", "etag", "checksum"):
        if entry.get(key):
            return str(entry[key])
    return None


def _local_path(base: str, path: Any) -> str | None:
    """Normalised POSIX path relative to the project root, or None if not a local relative path."""
    if not isinstance(path, str) or "://" in path or path.startswith("/"):
        return None
    norm = posixpath.normpath(posixpath.join(base, path)) if base else posixpath.normpath(path)
    return None if norm.startswith("..") or norm == "." else norm


def dvc_data_hashes(project_root: str | Path) -> dict[str, str]:
    """DVC content hashes of every data path the pipeline knows, keyed by path.

    Reads ``<project_root>/dvc.lock`` (every stage's ``deps`` and ``outs``; an
    ``outs`` entry wins over a ``deps`` entry for the same path) and each
    ``<project_root>/*.dvc`` file (``outs``, paths relative to the ``.dvc``
    file). Values are DVC's ``md5`` (``...dir`` for directories; ``etag`` or
    ``checksum`` for remote-style entries). Keys are POSIX paths relative to
    the project root, e.g. ``{"artifacts/prepared": "3f2a...dir"}``. Missing
    files give an empty dict. Never imports dvc (parses YAML).

    Raises:
        ValueError: a file is not valid YAML or not shaped like a DVC lock /
            ``.dvc`` file; the message names the file.
    """
    root = Path(project_root)
    deps: dict[str, str] = {}
    outs: dict[str, str] = {}

    def _load(path: Path) -> Any:
        try:
            return yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from e

    def _entries(path: Path, block: Any, what: str) -> list[Mapping[str, Any]]:
        if block is None:
            return []
        if not isinstance(block, list) or not all(isinstance(x, Mapping) for x in block):
            raise ValueError(f"{path}: {what} must be a list of mappings, got {block!r:.200}")
        return block

    lock = root / "dvc.lock"
    if lock.is_file():
        doc = _load(lock) or {}
        if not isinstance(doc, Mapping):
            raise ValueError(f"{lock}: expected a mapping at top level, got {type(doc).__name__}")
        stages = doc.get("stages", {}) if "schema" in doc else doc  # schema 2.0 vs 1.0
        if not isinstance(stages, Mapping):
            raise ValueError(f"{lock}: 'stages' must be a mapping, got {stages!r:.200}")
        for name, stage in stages.items():
            if not isinstance(stage, Mapping):
                raise ValueError(f"{lock}: stage {name!r} must be a mapping, got {stage!r:.200}")
            for target, key in ((deps, "deps"), (outs, "outs")):
                for entry in _entries(lock, stage.get(key), f"stages.{name}.{key}"):
                    p, h = _local_path("", entry.get("path")), _out_hash(entry)
                    if p and h:
                        target[p] = h

    for dvc_file, entry in dvc_file_outs(root, strict=True):
        p, h = _local_path("", entry.get("path")), _out_hash(entry)
        if p and h:
            outs[p] = h

    return {**deps, **outs}


def dvc_file_outs(project_root: str | Path, *, strict: bool) -> list[tuple[Path, Mapping[str, Any]]]:
    """``(dvc_file, out_entry)`` for every ``outs`` entry of the project's top-level ``*.dvc`` files.

    The one reader of ``.dvc`` files here (``dvc_data_hashes``, ``dvc_datasets``). ``strict``:
    raise ``ValueError`` naming the file when one is not valid YAML or not shaped like a ``.dvc``
    file; otherwise skip such a file (a dataset description must never stop a stage).
    """
    root = Path(project_root)
    found: list[tuple[Path, Mapping[str, Any]]] = []
    for dvc_file in sorted(p for p in root.glob("*.dvc") if p.is_file()):  # not the .dvc/ directory
        try:
            doc = yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}
            if not isinstance(doc, Mapping):
                raise ValueError(f"{dvc_file}: expected a mapping at top level, got {type(doc).__name__}")
            entries = doc.get("outs") or []
            if not isinstance(entries, list) or not all(isinstance(x, Mapping) for x in entries):
                raise ValueError(f"{dvc_file}: outs must be a list of mappings, got {entries!r:.200}")
        except (OSError, yaml.YAMLError, ValueError) as e:
            if strict:
                raise ValueError(str(e) if isinstance(e, ValueError) else f"{dvc_file}: not valid YAML: {e}") from e
            continue
        found.extend((dvc_file, entry) for entry in entries)
    return found


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            flat.update(_flatten(v, f"{key}."))
        else:
            flat[key] = v
    return flat


def _check_key(key: str, what: str) -> str:
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LEN or not _KEY_RE.match(key):
        raise ValueError(
            f"invalid MLflow {what} key {key!r}: needs 1..{_MAX_KEY_LEN} characters from "
            "letters, digits, '_', '-', '.', ' ', ':', '/'"
        )
    if posixpath.normpath(key) != key:
        raise ValueError(f"invalid MLflow {what} key {key!r}: must be a normalised path (no '//', './', '..')")
    return key


def _param_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        s = json.dumps(list(v), default=str)
    else:
        s = str(v)
    return s[:_MAX_PARAM_VAL_LEN]


def _chunks(items: list[Any], n: int) -> list[list[Any]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("run_id"), str) else None


def _http_unreachable(tracking_uri: str) -> str | None:
    """None if ``<uri>/health`` answers at all (any HTTP status), else the reason."""
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=_HEALTH_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # the server answered; /health may just not exist behind a proxy
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"tracking server {tracking_uri} unreachable ({reason})"


def _open_http(tracking_uri: str) -> str | None:
    """For an ``http(s)`` store: the reason it is unreachable, or None after setting MLflow's HTTP
    retry/timeout defaults (``_HTTP_ENV_DEFAULTS``, unless already set). None for other stores."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    why = _http_unreachable(tracking_uri)
    if why is None:
        for k, v in _HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
    return why


def _experiment_id(client: Any, tracking_uri: str, name: str) -> str:
    """Id of experiment ``name``: created when missing (SQLite stores: artifacts beside the
    database), restored when deleted. Its kind (tag ``EXPERIMENT_KIND_TAG``) is set to model
    training when it has none, so MLflow 3's UI opens on the runs table, not the GenAI traces."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, artifact_location=_sqlite_artifact_location(tracking_uri, name),
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def _git_tags(project_root: Path) -> dict[str, str]:
    """``git.dirty`` and, inside a git work tree, ``git.commit`` / ``mlflow.source.git.commit``."""
    commit, dirty = git_commit(project_root)
    tags = {"git.dirty": str(dirty).lower()}
    if commit:
        tags["git.commit"] = tags["mlflow.source.git.commit"] = commit
    return tags


def _md5(path: Path) -> str:
    import hashlib

    h = hashlib.md5()  # noqa: S324 - DVC's content hash, not security
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: Which prepared splits each stage reads, with MLflow's dataset context tag (``mlflow.data.context``).
_STAGE_SPLITS = {"train": (("train_split", "training"), ("valid_split", "validation")),
                 "evaluate": (("test_splits", "test"),)}


def dvc_datasets(project_root: str | Path, stage: str) -> list[dict[str, str]]:
    """The DVC-versioned data a stage reads, described as MLflow dataset inputs.

    For ``train``: the raw corpus (each ``*.dvc`` file's output: name = its path, digest = DVC's
    ``md5`` from the ``.dvc`` file) and the training and validation splits; for ``evaluate``: the
    test splits. A split is one dataset per file of ``artifacts/prepared`` (``{split}.{lang}``,
    names and languages from ``params.yaml``'s ``data`` block): digest = the file's MD5, which is
    DVC 3's content hash of that file (so it matches the ``.dir`` manifest of ``artifacts/prepared``
    in the DVC cache); source = its path; profile = lines and bytes. Missing files are skipped;
    other stages get ``[]``.

    Returns:
        ``[{"name", "digest", "source", "context", "profile"}]`` (all strings).
    """
    root = Path(project_root)
    splits = _STAGE_SPLITS.get(stage)
    if not splits:
        return []
    out: list[dict[str, str]] = []
    if stage == "train":
        for dvc_file, entry in dvc_file_outs(root, strict=False):
            h = _out_hash(entry)
            if h and entry.get("path"):
                out.append({"name": str(entry["path"]), "digest": h.removesuffix(".dir"),
                            "source": f"{dvc_file.name}: {entry['path']} (DVC {h})", "context": "source",
                            "profile": json.dumps({"files": entry.get("nfiles"), "bytes": entry.get("size")})})
    try:
        data = (yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}).get("data") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return out
    langs = [data.get("src_lang"), data.get("tgt_lang")]
    for key, context in splits:
        names = data.get(key) or []
        for split in [names] if isinstance(names, str) else list(names):
            for lang in langs:
                f = root / "artifacts" / "prepared" / f"{split}.{lang}"
                if not f.is_file():
                    continue
                with f.open("rb") as fh:
                    lines = sum(1 for _ in fh)
                out.append({"name": f.name, "digest": _md5(f), "source": f.relative_to(root).as_posix(),
                            "context": context, "profile": json.dumps({"lines": lines, "bytes": f.stat().st_size})})
    return out


# --------------------------------------------------------------------------- tracker


class Tracker:
    """One stage's MLflow child run under the pipeline's parent run (see module doc).

    Use as a context manager::

        with Tracker("train", project_root=root) as t:
            t.log_params(params.model_dump(mode="json"))
            for step in ...:
                t.log_metrics({"train/loss": loss, "lr": lr}, step=step)
            t.log_artifacts(layout.model, "model")

    Args:
        stage: stage name; the child run's name and its ``aiayn.stage`` tag.
        project_root: project root (default store, ``dvc.lock``, state file).
        experiment: MLflow experiment name (ignored when ``AIAYN_PARENT_RUN_ID``
            is set: the child joins the parent's experiment).
        tracking_uri: overrides ``MLFLOW_TRACKING_URI`` and the SQLite default.
        enabled: False makes every call a no-op (so does ``AIAYN_TRACKING=0``).
        end_pipeline: end the parent run when this stage ends; default True for
            the last pipeline stage (``aiayn.stages.STAGES[-1]``).
        flush_every: buffered ``log_metrics`` calls that trigger a flush.
        flush_seconds: seconds since the last flush that trigger a flush (checked
            on each ``log_metrics`` call; there is no background thread).
    """

    def __init__(
        self,
        stage: str,
        *,
        project_root: str | Path,
        experiment: str = "aiayn",
        tracking_uri: str | None = None,
        enabled: bool = True,
        end_pipeline: bool | None = None,
        flush_every: int = 50,
        flush_seconds: float = 10.0,
    ) -> None:
        if not stage or not _KEY_RE.match(stage):
            raise ValueError(f"invalid stage name {stage!r}")
        if flush_every < 1 or flush_seconds < 0:
            raise ValueError(f"flush_every must be >= 1 and flush_seconds >= 0, got {flush_every}, {flush_seconds}")
        self.stage = stage
        self.project_root = Path(project_root).resolve()
        self.experiment = experiment
        self.tracking_uri = resolve_tracking_uri(self.project_root, tracking_uri)
        self._enabled = tracking_enabled(enabled)
        self._end_pipeline = end_pipeline
        self._flush_every = flush_every
        self._flush_seconds = flush_seconds

        self._active = False  # True between a successful enter and exit / first failure
        self._client: Any = None
        self._experiment_id: str | None = None
        self._run_id: str | None = None
        self._parent_run_id: str | None = None
        self._owns_parent = False
        self._parent_params: set[str] = set()
        self._params: dict[str, str] = {}
        self._buffer: list[Any] = []  # mlflow.entities.Metric
        self._calls_since_flush = 0
        self._last_flush = time.monotonic()
        self._warned = False

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
    def state_path(self) -> Path:
        return self.project_root / STATE_FILE

    def run_url(self, *, parent: bool = False) -> str | None:
        """Where to look at this run (``parent=True``: its pipeline run): the UI link
        for an ``http(s)`` tracking URI, else a ``mlflow ui --backend-store-uri ...``
        hint. None when disabled."""
        if not self._active:
            return None
        run_id = self._parent_run_id if parent else self._run_id
        if self.tracking_uri.startswith(("http://", "https://")):
            base = self.tracking_uri.rstrip("/")
            return f"{base}/#/experiments/{self._experiment_id}/runs/{run_id}"
        return (
            f"mlflow ui --backend-store-uri {self.tracking_uri}  "
            f"(experiment {self._experiment_id}, run {run_id})"
        )

    def parent_run_url(self) -> str | None:
        """``run_url`` of the pipeline (parent) run."""
        return self.run_url(parent=True)

    # ----------------------------------------------------------------- failure

    def _disable(self, why: str) -> None:
        self._active = False
        self._buffer.clear()
        if not self._warned:
            self._warned = True
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
        why = _open_http(self.tracking_uri)
        if why:
            self._disable(why)
            return self
        self._active = True
        self._guard(self._start)
        return self

    def _start(self) -> None:
        from mlflow import MlflowClient

        _open_sqlite(self.tracking_uri)
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        tags = self._context_tags()
        env_parent = os.environ.get("AIAYN_PARENT_RUN_ID")
        state: dict[str, Any] | None = None
        if env_parent:
            parent = self._client.get_run(env_parent)  # raises if missing -> disabled
            self._experiment_id = parent.info.experiment_id
            self._parent_run_id = env_parent
            self._owns_parent = False
        else:
            self._experiment_id = self._experiment()
            state = self._resolve_parent()
            self._owns_parent = True
        self._set_tags(self._parent_run_id, tags)
        self._parent_params = set(self._client.get_run(self._parent_run_id).data.params)

        run = self._client.create_run(
            self._experiment_id,
            run_name=self.stage,
            tags={"mlflow.parentRunId": self._parent_run_id, "aiayn.stage": self.stage, "aiayn.kind": "stage"},
        )
        self._run_id = run.info.run_id
        self._set_tags(self._run_id, tags)
        self._log_datasets()
        if state is not None:
            state["stages"][self.stage] = {"run_id": self._run_id, "status": "RUNNING"}
            atomic_write_json(self.state_path, state)

    def _log_datasets(self) -> None:
        """Log ``dvc_datasets`` of this stage as dataset inputs of the child and the parent run
        (a failure here is one warning; tracking goes on)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        try:
            found = dvc_datasets(self.project_root, self.stage)
            inputs = [DatasetInput(Dataset(d["name"], d["digest"], "dvc", d["source"], profile=d["profile"]),
                                   tags=[InputTag("mlflow.data.context", d["context"])]) for d in found]
            for run_id in (self._run_id, self._parent_run_id) if inputs else ():
                self._client.log_inputs(run_id, datasets=inputs)
        except Exception as e:  # noqa: BLE001 - dataset inputs are a view, never a reason to stop tracking
            log.warning("dataset inputs not logged: %s: %s", type(e).__name__, e)

    def _experiment(self) -> str:
        return _experiment_id(self._client, self.tracking_uri, self.experiment)

    def _resolve_parent(self) -> dict[str, Any]:
        """Pick or start the parent run (rule 2 of the module doc); return the new state."""
        from mlflow.exceptions import MlflowException

        old = _read_state(self.state_path)
        same_store = (
            old is not None
            and old.get("tracking_uri") == self.tracking_uri
            and old.get("experiment_id") == self._experiment_id
        )
        old_status = None
        if same_store:
            try:
                old_status = self._client.get_run(old["run_id"]).info.status
            except MlflowException:
                old_status = None  # deleted or a wiped store: start fresh
        stages = old.get("stages", {}) if old else {}
        if same_store and old_status == "RUNNING" and self.stage not in stages:
            self._parent_run_id = old["run_id"]
            return old
        if same_store and old_status == "RUNNING":
            self._supersede(old)
        parent = self._client.create_run(
            self._experiment_id, run_name="pipeline", tags={"aiayn.kind": "pipeline"}
        )
        self._parent_run_id = parent.info.run_id
        return {
            "run_id": self._parent_run_id,
            "experiment_id": self._experiment_id,
            "tracking_uri": self.tracking_uri,
            "stages": {},
        }

    def _supersede(self, old: dict[str, Any]) -> None:
        """End a still-running parent that a new pipeline run replaces."""
        failed = False
        for info in old.get("stages", {}).values():
            status = info.get("status") if isinstance(info, dict) else None
            if status == "RUNNING":  # its process died without ending the child
                self._client.set_terminated(info["run_id"], status="KILLED")
            failed = failed or status in ("RUNNING", "FAILED", "KILLED")
        self._client.set_terminated(old["run_id"], status="FAILED" if failed else "FINISHED")

    def _context_tags(self) -> dict[str, str]:
        tags = _git_tags(self.project_root)
        if os.environ.get("DVC_EXP_NAME"):  # set by DVC for queued / temp experiments
            tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
        try:
            hashes = dvc_data_hashes(self.project_root)
        except ValueError as e:
            log.warning("no data hashes logged: %s", e)
            hashes = {}
        for path, h in hashes.items():
            key = _BAD_KEY_CHARS.sub("_", f"data_hash.{path}")[:_MAX_KEY_LEN]
            tags[key] = h
        return tags

    def _set_tags(self, run_id: str | None, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:_MAX_TAG_VAL_LEN]) for k, v in tags.items()]
        for chunk in _chunks(items, _MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, tags=chunk)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if not self._active:
            return False
        self.flush()
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        self._guard(self._finish, status)
        self._active = False
        return False  # never swallow the caller's exception

    def _finish(self, status: str) -> None:
        self._client.set_terminated(self._run_id, status=status)
        if not self._owns_parent:
            return
        end = self._end_pipeline
        if end is None:
            from aiayn.stages import STAGES

            end = self.stage == STAGES[-1]
        if end:
            self._client.set_terminated(self._parent_run_id, status=status)
            self.state_path.unlink(missing_ok=True)
            return
        state = _read_state(self.state_path)
        if state is not None and state["run_id"] == self._parent_run_id:
            state.setdefault("stages", {})[self.stage] = {"run_id": self._run_id, "status": status}
            atomic_write_json(self.state_path, state)

    # ----------------------------------------------------------------- logging

    def log_params(self, params: Mapping[str, Any] | Any, *, parent: bool | None = None) -> None:
        """Log (nested) params on the child run, flattened to ``a.b.c`` keys.

        Values are stringified (lists/tuples as JSON) and cut to MLflow's 6000
        characters. A pydantic model is accepted (``model_dump(mode="json")``).
        With ``parent`` (default: True for the ``train`` stage) they are also
        logged on the parent, skipping keys the parent already has (params are
        immutable in MLflow; the first stage to log a key wins there).

        Raises:
            ValueError: a key MLflow would reject (quoted), or a key logged
                twice on this run with a different value.
        """
        if hasattr(params, "model_dump"):
            params = params.model_dump(mode="json")
        if not isinstance(params, Mapping):
            raise ValueError(f"log_params expects a mapping, got {type(params).__name__}")
        flat = {_check_key(k, "param"): _param_value(v) for k, v in _flatten(params).items()}
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
            parent = self.stage == "train"
        self._guard(self._log_params, self._run_id, new)
        if parent and self._active:
            fresh = {k: v for k, v in new.items() if k not in self._parent_params}
            self._parent_params.update(fresh)
            self._guard(self._log_params, self._parent_run_id, fresh)

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for chunk in _chunks(items, _MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int, *, parent: bool = False) -> None:
        """Buffer ``metrics`` at ``step`` (timestamped now); flushed in batches.

        ``step`` may be passed positionally, so ``log_metrics`` fits the
        trainer's ``on_metrics(metrics, step)`` callback directly.

        A flush (one ``MlflowClient.log_batch`` per 1000 metrics) happens every
        ``flush_every`` calls, when ``flush_seconds`` have passed since the last
        flush, and on exit. ``parent=True`` also logs them on the parent run;
        the stage's ``HEADLINE_METRICS`` (BLEU/chrF per test set, validation loss)
        always go there too, so pipeline runs compare on one row each.

        Raises:
            ValueError: a bad key, a value that is not a real number, or a
                negative / non-integer ``step`` (all quoted).
        """
        try:
            step_i = operator.index(step)  # int, numpy or torch integer scalars
        except TypeError:
            step_i = -1
        if isinstance(step, bool) or step_i < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        step = step_i
        values: dict[str, float] = {}
        for k, v in metrics.items():
            _check_key(k, "metric")
            try:
                values[k] = float(v)
            except (TypeError, ValueError) as e:
                raise ValueError(f"metric {k!r} at step {step}: not a number: {v!r}") from e
        if not self._active:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)  # milliseconds
        self._buffer.extend((self._run_id, Metric(k, v, ts, step)) for k, v in values.items())
        headline = HEADLINE_METRICS.get(self.stage)
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
            for chunk in _chunks(items, _MAX_METRICS_PER_BATCH):
                self._guard(self._client.log_batch, run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags on the child run (values stringified, cut to 8000 characters).

        Raises:
            ValueError: a key MLflow would reject (quoted).
        """
        checked = {_check_key(k, "tag"): v for k, v in tags.items()}
        if self._active:
            self._guard(self._set_tags, self._run_id, checked)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload one file to the child run's artifacts (under ``artifact_path``).

        Raises:
            FileNotFoundError: ``path`` is not a file.
        """
        if not Path(path).is_file():
            raise FileNotFoundError(f"log_artifact: no such file: {path}")
        if self._active:
            self._guard(self._client.log_artifact, self._run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Upload a directory's contents to the child run's artifacts.

        Raises:
            FileNotFoundError: ``directory`` is not a directory.
        """
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"log_artifacts: no such directory: {directory}")
        if self._active:
            self._guard(self._client.log_artifacts, self._run_id, str(directory), artifact_path)

    def register_model(
        self, model_dir_or_artifact_path: str | Path, name: str, alias: str | None = None
    ) -> str | None:
        """Register a model version in the MLflow Model Registry (for the export stage).

        ``model_dir_or_artifact_path`` is either a local file/directory, which is
        first uploaded to this run's artifacts under ``registered/<name>``, or an
        artifact path already logged on this run. Creates the registered model
        ``name`` if needed, a version whose source is ``runs:/<run_id>/<path>``,
        and points ``alias`` (e.g. ``"champion"``) at it. The bundle need not be
        an MLflow ``MLmodel`` flavour; consumers download the source artifacts.

        Returns:
            The new version number as a string, or None when tracking is off.
        """
        if not self._active:
            return None
        local = Path(model_dir_or_artifact_path)
        if local.exists():
            artifact_path = f"registered/{name}"
            if local.is_dir():
                self.log_artifacts(local, artifact_path)
            else:
                self.log_artifact(local, artifact_path)
        else:
            artifact_path = str(model_dir_or_artifact_path).strip("/")
        return self._guard(self._register, artifact_path, name, alias)

    def _register(self, artifact_path: str, name: str, alias: str | None) -> str:
        from mlflow.exceptions import MlflowException

        try:
            self._client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        mv = self._client.create_model_version(
            name, source=f"runs:/{self._run_id}/{artifact_path}", run_id=self._run_id
        )
        if alias:
            self._client.set_registered_model_alias(name, alias, mv.version)
        return str(mv.version)


    def register_translation_model(
        self, bundle_dir: str | Path, *, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
        predictor: type, tags: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Log a serving bundle on this run as an MLflow pyfunc model (``serving_model``), register a
        version of ``name`` and give it an alias by ``choose_alias``.

        ``predictor``: the class the pyfunc model runs (``aiayn.export.BundlePredictor``: built from the
        bundle folder, ``parse(model_input)`` and ``translate(sentences)``). The version carries tags
        ``bleu.<gate_split>``, ``gate_split``, ``variant`` and ``tags``. Returns
        ``{"version", "alias", "champion_bleu_before"}``, or None when tracking is off or MLflow failed
        (one warning, the pipeline goes on; the bundle on disk is unaffected).
        """
        if not self._active:
            return None
        return self._guard(self._register_translation, Path(bundle_dir), name, variant, gate_split, float(bleu),
                           list(example), predictor, dict(tags or {}))

    def _register_translation(self, bundle: Path, name: str, variant: str, gate_split: str, bleu: float,
                              example: list[str], predictor: type, tags: dict[str, Any]) -> dict[str, Any]:
        import tempfile

        from mlflow.exceptions import MlflowException

        from mlflow.entities import LoggedModelOutput

        version_tags = {f"bleu.{gate_split}": repr(bleu), "variant": variant, "gate_split": gate_split} | {
            k: str(v) for k, v in tags.items()}
        # an MLflow 3 logged model whose source run is the PIPELINE run (MLflow's runs table fills its Models
        # column from the source run, and the pipeline run is the row reviewers compare), listed as an output
        # of that run and of this export run; then a registry version of it, linked to both
        source_run = self._parent_run_id or self._run_id
        model = self._client.create_logged_model(self._experiment_id, name="serving_model", source_run_id=source_run,
                                                 tags=version_tags | {"aiayn.export_run_id": self._run_id},
                                                 model_type="translation")
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "serving_model"
            save_translation_pyfunc(bundle, local, example=example, predictor=predictor)
            self._client.log_model_artifacts(model.model_id, str(local))
        # the SERVED variant's score, under its own key: `<split>.bleu` on the pipeline run is evaluate's
        # (the float model's), which the runs table, `dvc metrics show` and the report all show
        self._client.log_metric(source_run, f"serving.{gate_split}.bleu", bleu, model_id=model.model_id)
        self._client.finalize_logged_model(model.model_id, "READY")
        for run_id in dict.fromkeys((self._run_id, self._parent_run_id)):
            self._client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
        try:
            self._client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # source models:/<model_id> is what links the version to the logged model (MLflow's OSS registry keeps
        # no model_id column). For such a source MLflow's SQL registry looks the model up through the
        # process-global tracking URI, not this client's (its own TODO), so point that at ours meanwhile.
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        with _use_tracking_uri(self.tracking_uri):
            mv = self._client.create_model_version(name, source=f"models:/{model.model_id}", run_id=source_run,
                                                   tags=version_tags, model_id=model.model_id)
        champion_bleu = _alias_bleu(self._client, name, CHAMPION, gate_split)
        alias = choose_alias(bleu, champion_bleu)
        self._client.set_registered_model_alias(name, alias, mv.version)
        return {"version": str(mv.version), "alias": alias, "champion_bleu_before": champion_bleu}


# --------------------------------------------------------------------------- model registry

CHAMPION, CHALLENGER = "champion", "challenger"


def choose_alias(new_bleu: float, champion_bleu: float | None) -> str:
    """The alias a new version gets: ``champion`` when there is no champion yet or
    ``new_bleu >= champion_bleu`` (a tie moves the alias: the newer pipeline run, with the newest code
    and data, wins at equal quality), else ``challenger``. A champion without a BLEU tag counts as absent."""
    if champion_bleu is None or new_bleu >= champion_bleu:
        return CHAMPION
    return CHALLENGER


class RegistryError(RuntimeError):
    """The model registry cannot be reached, or has no version under the asked alias (one line)."""


def _alias_bleu(client: Any, name: str, alias: str, gate_split: str) -> float | None:
    """BLEU tag of the version ``alias`` points at; None when there is no such alias (or no tag)."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    tag = (mv.tags or {}).get(f"bleu.{gate_split}")
    return float(tag) if tag is not None else None


def translation_pyfunc_class(predictor: type) -> type:
    """The ``mlflow.pyfunc.PythonModel`` subclass that serves a bundle with ``predictor`` (built on
    demand so that importing this module never imports mlflow; cloudpickle stores the class by value and
    ``predictor`` by reference, so loading it needs the ``aiayn`` package installed).

    ``predict(context, model_input)``: ``predictor.parse`` turns what MLflow passes (a list, or the
    one-column DataFrame its string-column schema makes of REST ``inputs``, ``dataframe_split`` and
    ``dataframe_records``) into sentences; a ``TypeError``/``ValueError`` there becomes
    ``MlflowException(INVALID_PARAMETER_VALUE)``, HTTP 400 in the scoring server. Translations come
    back in input order, one per sentence.
    """
    import mlflow.pyfunc

    class AiaynTranslationModel(mlflow.pyfunc.PythonModel):
        def __getstate__(self) -> dict:  # everything comes from the bundle artifact in load_context
            return {}

        def __setstate__(self, state: dict) -> None:
            pass

        def load_context(self, context):
            self.predictor = predictor(context.artifacts["bundle"],
                                       threads=int(os.environ.get("AIAYN_SERVE_THREADS", "1")))

        def predict(self, context, model_input, params=None):
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            try:
                sentences = self.predictor.parse(model_input)
            except (TypeError, ValueError) as e:
                raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
            return self.predictor.translate(sentences)

    return AiaynTranslationModel


def save_translation_pyfunc(bundle: str | Path, path: str | Path, *, example: list[str], predictor: type) -> Path:
    """Save the bundle as an MLflow pyfunc model directory at ``path``: an explicit string-column
    signature (string in, string out) and ``example`` as the input example."""
    from importlib.metadata import version as _version

    import mlflow.pyfunc
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema

    reqs = [f"{pkg}=={_version(pkg)}" for pkg in ("mlflow", "torch", "ctranslate2", "sentencepiece", "numpy", "pandas")]
    # an explicit column signature, not type hints: with a type hint MLflow's scoring server accepts only
    # `inputs` payloads and refuses `dataframe_split` / `dataframe_records`
    signature = ModelSignature(inputs=Schema([ColSpec(DataType.string)]), outputs=Schema([ColSpec(DataType.string)]))
    mlflow.pyfunc.save_model(str(path), python_model=translation_pyfunc_class(predictor)(), artifacts={"bundle": str(bundle)},
                             signature=signature, input_example=list(example), pip_requirements=reqs)
    return Path(path)


def registered_version(name: str, alias: str, *, tracking_uri: str) -> str:
    """Version number the alias points at now. Raises ``RegistryError`` (unreachable, no such alias)."""
    if tracking_uri.startswith(("http://", "https://")):
        why = _http_unreachable(tracking_uri)
        if why:
            raise RegistryError(f"model registry {tracking_uri} unreachable: {why}")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return str(MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_by_alias(name, alias).version)
    except MlflowException as e:
        raise RegistryError(f"models:/{name}@{alias} not found in {tracking_uri}: {' '.join(str(e).split())[:300]}") from None


def download_registered_bundle(name: str, alias: str, *, tracking_uri: str, dst: str | Path) -> tuple[str, Path]:
    """``(version, bundle folder)``: the serving bundle of ``models:/name@alias`` downloaded into ``dst``.
    Raises ``RegistryError`` (unreachable, no such alias, no bundle in the model)."""
    version = registered_version(name, alias, tracking_uri=tracking_uri)
    import mlflow.artifacts

    from mlflow import MlflowClient

    try:
        source = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_download_uri(name, version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=tracking_uri))
    except Exception as e:  # noqa: BLE001 - one message for every transport failure
        raise RegistryError(f"could not download models:/{name}/{version}: {type(e).__name__}: {e}") from None
    found = sorted(local.rglob("bundle.json"))
    if not found:
        raise RegistryError(f"models:/{name}/{version} holds no serving bundle (bundle.json)")
    return version, found[0].parent


# --------------------------------------------------------------------------- pipeline end


def end_pipeline_run(
    project_root: str | Path,
    *,
    status: str = "FINISHED",
    tracking_uri: str | None = None,
    enabled: bool = True,
) -> str | None:
    """End the recorded parent run (``.aiayn/pipeline_run.json``) and delete the state file.

    For pipelines that stop before the last stage. Never raises for MLflow
    failures (logs one warning). Returns the ended run id, or None when there
    was no recorded run, tracking is off, or the state belongs to another
    tracking URI.

    Raises:
        ValueError: ``status`` is not FINISHED, FAILED or KILLED.
    """
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, got {status!r}")
    root = Path(project_root).resolve()
    state_path = root / STATE_FILE
    state = _read_state(state_path)
    uri = resolve_tracking_uri(root, tracking_uri)
    if not tracking_enabled(enabled) or state is None or state.get("tracking_uri") != uri:
        return None
    why = _http_unreachable(uri) if uri.startswith(("http://", "https://")) else None
    if why:
        log.warning("MLflow tracking: could not end pipeline run %s: %s", state["run_id"], why)
        return None
    try:
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=uri).set_terminated(state["run_id"], status=status)
    except Exception as e:  # noqa: BLE001 - tracking must never stop the pipeline
        log.warning("MLflow tracking: could not end pipeline run %s: %s: %s", state["run_id"], type(e).__name__, e)
        return None
    state_path.unlink(missing_ok=True)
    return state["run_id"]



# --------------------------------------------------------------------------- drift checks

#: Experiment of the drift checks (one flat run per check, apart from the pipeline runs).
DRIFT_EXPERIMENT = "aiayn-drift"


def _standalone_run(project_root: str | Path, tracking_uri: str | None,
                    record: Callable[[Any, Path, str], str]) -> str | None:
    """Open the project's tracking store and call ``record(client, root, uri) -> run_id`` for a run
    outside any pipeline (a drift check, a study). Never fails the caller: tracking off
    (``AIAYN_TRACKING=0``) returns None; an unreachable server or any failing MLflow call logs one
    warning ("MLflow tracking disabled: ...") and returns None."""
    if not tracking_enabled(True):
        return None
    root = Path(project_root).resolve()
    uri = resolve_tracking_uri(root, tracking_uri)
    why = _open_http(uri)
    if why:
        log.warning("MLflow tracking disabled: %s", why)
        return None
    try:
        from mlflow import MlflowClient

        _open_sqlite(uri)
        return record(MlflowClient(tracking_uri=uri), root, uri)
    except Exception as e:  # noqa: BLE001 - tracking never fails a check or a study
        log.warning("MLflow tracking disabled: %s: %s", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None


def log_drift_check(project_root: str | Path, summary: Mapping[str, Any], report_dir: str | Path | None, *,
                    experiment: str = DRIFT_EXPERIMENT, tracking_uri: str | None = None) -> str | None:
    """Record one drift check (``monitoring.drift.run_check``) as an MLflow run; return its id.

    Run ``drift-check`` in ``experiment``; tags ``drift.verdict``, ``drift.window_source``,
    ``drift.reference_model_sha256``, ``drift.drifted`` and the git commit; metrics
    ``window.sentences``, ``drifted_share``, ``drift`` (1/0), ``<descriptor>.statistic`` and
    ``<descriptor>.drifted`` per test, ``embeddings.statistic``; the report folder as artifacts
    (``drift/``). Like ``Tracker``, it never fails the caller: an unreachable server or a failing
    call logs one warning ("MLflow tracking disabled: ...") and returns None. ``AIAYN_TRACKING=0``
    turns it off.
    """
    def record(client: Any, root: Path, uri: str) -> str:
        from mlflow.entities import Metric, RunTag

        window = summary.get("window", {})
        tags = _git_tags(root) | {
            "aiayn.kind": "drift-check", "drift.verdict": str(summary.get("verdict")),
            "drift.window_source": str(window.get("file") or window.get("log") or ""),
            "drift.reference_model_sha256": str(summary.get("reference", {}).get("model_sha256")),
            "drift.drifted": ",".join(summary.get("drifted", [])) or "none"}
        run = client.create_run(_experiment_id(client, uri, experiment), run_name="drift-check", tags=tags)
        now = int(time.time() * 1000)
        values: dict[str, float] = {"window.sentences": float(window.get("sentences", 0))}
        if summary.get("drifted_share") is not None:
            values["drifted_share"] = float(summary["drifted_share"])
            values["drift"] = float(summary.get("verdict") == "drift")
        for name, t in (summary.get("descriptors") or {}).items():
            values[f"{name}.statistic"] = float(t["statistic"])
            values[f"{name}.drifted"] = float(bool(t["drifted"]))
        if summary.get("embeddings"):
            values["embeddings.statistic"] = float(summary["embeddings"]["statistic"])
            values["embeddings.drifted"] = float(bool(summary["embeddings"]["drifted"]))
        client.log_batch(run.info.run_id, metrics=[Metric(_BAD_KEY_CHARS.sub("_", k), v, now, 0)
                                                   for k, v in values.items()],
                         tags=[RunTag("mlflow.note.content", f"drift check: {summary.get('verdict')}")])
        if report_dir is not None and Path(report_dir).is_dir():
            client.log_artifacts(run.info.run_id, str(report_dir), "drift")
        client.set_terminated(run.info.run_id, status="FINISHED")
        return run.info.run_id

    return _standalone_run(project_root, tracking_uri, record)


def stage_metrics_by_experiment(project_root: str | Path, exp_names: list[str], stage: str, *,
                                experiment: str = "aiayn", tracking_uri: str | None = None) -> dict[str, dict[str, float]]:
    """The latest values of every metric of ``stage``'s newest run per DVC experiment name.

    Stage runs carry the tag ``dvc.exp_name`` when DVC ran them as an experiment
    (``dvc exp run --queue/--temp`` sets ``DVC_EXP_NAME``). Returns ``{exp_name: {metric: value}}``
    for the names found; ``{}`` when tracking is off or the store cannot be read (one warning).
    """
    if not tracking_enabled(True) or not exp_names:
        return {}
    uri = resolve_tracking_uri(Path(project_root).resolve(), tracking_uri)
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        for name in exp_names:
            runs = client.search_runs([exp.experiment_id],
                                      f"tags.`dvc.exp_name` = '{name}' and tags.`aiayn.stage` = '{stage}'",
                                      order_by=["attributes.start_time DESC"], max_results=1)
            if runs:
                out[name] = dict(runs[0].data.metrics)
        return out
    except Exception as e:  # noqa: BLE001 - a report without these numbers is still a report
        log.warning("MLflow store not readable: %s: %s", type(e).__name__, e)
        return {}


def log_study(project_root: str | Path, name: str, metrics: Mapping[str, float], params: Mapping[str, Any],
              artifacts: str | Path | None, *, experiment: str = "aiayn-studies",
              tracking_uri: str | None = None) -> str | None:
    """Record one study (e.g. the seed-variance report, ``benchmarks/variants.py``) as an MLflow run.

    Run ``name`` in ``experiment`` with ``params`` (the budget, seeds, variants), ``metrics``
    (means, standard deviations, ranges) and the files under ``artifacts`` (table, JSON, plot)
    as artifacts ``study/``. Returns the run id, or None when tracking is off or fails (one warning).
    """
    def record(client: Any, root: Path, uri: str) -> str:
        from mlflow.entities import Metric, Param

        run = client.create_run(_experiment_id(client, uri, experiment), run_name=name,
                                tags=_git_tags(root) | {"aiayn.kind": "study"})
        now = int(time.time() * 1000)
        ms = [Metric(_BAD_KEY_CHARS.sub("_", k)[:_MAX_KEY_LEN], float(v), now, 0) for k, v in metrics.items()]
        ps = [Param(_BAD_KEY_CHARS.sub("_", k)[:_MAX_KEY_LEN], _param_value(v)) for k, v in params.items()]
        for chunk in _chunks(ms, 1000):
            client.log_batch(run.info.run_id, metrics=chunk)
        for chunk in _chunks(ps, 100):
            client.log_batch(run.info.run_id, params=chunk)
        if artifacts is not None and Path(artifacts).is_dir():
            client.log_artifacts(run.info.run_id, str(artifacts), "study")
        client.set_terminated(run.info.run_id, status="FINISHED")
        return run.info.run_id

    return _standalone_run(project_root, tracking_uri, record)


# --------------------------------------------------------------------------- Hugging Face (mlflow.transformers)


def register_transformers_model(tracker: Tracker, hf_dir: str | Path, *, name: str, alias: str | None, task: str,
                                example: list[str]) -> str | None:
    """Log the Hugging Face Marian folder ``hf_dir`` (``aiayn.hf_marian.export_marian``) with MLflow's
    ``transformers`` flavor on ``tracker``'s run and register it as a version of ``name`` with
    ``alias``, so ``mlflow models serve -m models:/<name>@<alias>`` serves it with MLflow's stock server
    (a ``transformers`` pipeline of ``task``, e.g. ``translation_en_to_de``). The folder is saved as a
    checkpoint path: nothing is loaded here. Returns the version, or None when tracking is off or
    MLflow failed (one warning; the bundle and its version are unaffected).
    Raises ``FileNotFoundError`` when ``hf_dir`` has no ``config.json``.
    """
    import tempfile
    from importlib.metadata import version as _version

    if not (Path(hf_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (not a Hugging Face model folder)")
    if not tracker.active:
        return None
    reqs = [f"{pkg}=={_version(pkg)}" for pkg in ("mlflow", "transformers", "tokenizers", "torch", "sentencepiece")]
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "transformers_model"
        try:
            import mlflow.transformers

            mlflow.transformers.save_model(str(hf_dir), str(local), task=task, input_example=list(example),
                                           pip_requirements=reqs)
        except Exception as e:  # noqa: BLE001 - a failed extra flavor never fails the export
            log.warning("mlflow.transformers: %s not logged: %s: %s", name, type(e).__name__, e)
            return None
        return tracker.register_model(local, name, alias)
