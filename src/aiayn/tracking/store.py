"""The MLflow store: which one (the tracking URI), opening it safely, and the experiments in it.

Tracking URI, first match wins: the ``tracking_uri`` argument, the ``MLFLOW_TRACKING_URI``
environment variable, else a SQLite store inside the project, ``sqlite:///<project_root>/mlflow.db``.
For any ``sqlite:`` URI the experiment's artifacts go to ``mlruns/<experiment>`` beside the database
file (without this MLflow would put them in ``./mlruns`` of the *current working directory*). Other
stores (Postgres, an ``http(s)`` MLflow server) choose their own artifact location. A plain file
store is refused by MLflow 3.17 unless ``MLFLOW_ALLOW_FILE_STORE=true``; we never use it.

An ``http(s)`` store is probed first (``<uri>/health``): a refused connection or an unknown host is
unreachable at once; a server that accepts but is slow to answer (a loaded host) gets 2, 5, then 10 s
before it counts as unreachable (~17 s at most), so a busy server does not turn tracking off. Unless
already set, MLflow's HTTP client gets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=2`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT=30``
(MLflow's own defaults, 7 retries and 120 s, would stall training for minutes on an outage).

``AIAYN_TRACKING=0`` (``aiayn.config.settings``) turns tracking off.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiayn.config.settings import Settings

__all__ = [
    "tracking_enabled",
    "resolve_tracking_uri",
    "open_sqlite",
    "open_http",
    "http_unreachable",
    "experiment_id",
    "chunks",
    "EXPERIMENT_KIND_TAG",
    "EXPERIMENT_KIND",
]

# MLflow 3.17 limits (mlflow/utils/validation.py).
MAX_TAG_VALUE_LEN = 8000  # characters
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

#: MLflow 3's experiment kind (read by its UI; values from the UI's ExperimentKind enum): without
#: it, an experiment opens on the GenAI "traces" overview instead of the runs table.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"

_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
#: Seconds each ``/health`` try waits for an answer; the next try only follows a timeout.
_HEALTH_TIMEOUTS_S = (2.0, 5.0, 10.0)


def tracking_enabled(enabled: bool = True, settings: Settings | None = None) -> bool:
    """``enabled`` unless ``AIAYN_TRACKING`` is ``0``/``false``/``off``/``no`` (``settings``, default:
    read from the environment now)."""
    return enabled and (settings or Settings.from_env()).tracking


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


def open_sqlite(tracking_uri: str) -> None:
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


def http_unreachable(tracking_uri: str, timeouts_s: tuple[float, ...] = _HEALTH_TIMEOUTS_S) -> str | None:
    """None if ``<uri>/health`` answers at all (any HTTP status), else the reason (a string).

    One try per entry of ``timeouts_s`` (seconds); only a timeout leads to the next try: a refused
    connection or a name that does not resolve is the answer at once."""
    url = tracking_uri.rstrip("/") + "/health"
    reason: object = "no try"
    for timeout_s in timeouts_s:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s):
                return None
        except urllib.error.HTTPError:
            return None  # the server answered; /health may just not exist behind a proxy
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if not isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError (3.10+)
                break
            reason = f"no answer in {timeout_s:g} s"
    return f"tracking server {tracking_uri} unreachable ({reason})"


def open_http(tracking_uri: str) -> str | None:
    """For an ``http(s)`` store: the reason it is unreachable, or None after setting MLflow's HTTP
    retry/timeout defaults (``_HTTP_ENV_DEFAULTS``, unless already set). None for other stores."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    why = http_unreachable(tracking_uri)
    if why is None:
        for k, v in _HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
    return why


def experiment_id(client: Any, tracking_uri: str, name: str) -> str:
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


def chunks(items: list[Any], n: int) -> list[list[Any]]:
    """``items`` in consecutive lists of at most ``n`` (MLflow's per-batch limits)."""
    return [items[i : i + n] for i in range(0, len(items), n)]
