"""MLflow tracking: one parent run per pipeline run, one nested run per stage, the model registry.

The only package of ``aiayn`` that imports ``mlflow``, and only inside functions, so importing it
stays cheap. Stages never import it: they are handed a recorder (``aiayn.recording``), and whoever
starts a stage (``aiayn <stage>``, the Prefect stage flows) builds the MLflow one here
(``MlflowRecorder``). What a stage's run records is shaped by the ``StageRecord`` the stage opens it
with, never by knowledge of the pipeline in this package.

Each submodule holds one concern (its docstring says which); their public names are importable
from here.
"""

from __future__ import annotations

from aiayn.tracking.lineage import dvc_datasets, git_tags, lineage_tags
from aiayn.tracking.parent import STATE_FILE, end_pipeline_run
from aiayn.tracking.registry import (
    CHALLENGER,
    CHAMPION,
    RegistryError,
    choose_alias,
    download_registered_bundle,
    registered_version,
    save_translation_pyfunc,
    translation_pyfunc_class,
)
from aiayn.tracking.runs import MlflowRecorder, Tracker
from aiayn.tracking.standalone import DRIFT_EXPERIMENT, log_drift_check, log_study, stage_metrics_by_experiment
from aiayn.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, resolve_tracking_uri, tracking_enabled

__all__ = [
    "MlflowRecorder",
    "Tracker",
    "STATE_FILE",
    "end_pipeline_run",
    "resolve_tracking_uri",
    "tracking_enabled",
    "EXPERIMENT_KIND_TAG",
    "EXPERIMENT_KIND",
    "git_tags",
    "lineage_tags",
    "dvc_datasets",
    "CHAMPION",
    "CHALLENGER",
    "choose_alias",
    "RegistryError",
    "translation_pyfunc_class",
    "save_translation_pyfunc",
    "registered_version",
    "download_registered_bundle",
    "DRIFT_EXPERIMENT",
    "log_drift_check",
    "log_study",
    "stage_metrics_by_experiment",
]
