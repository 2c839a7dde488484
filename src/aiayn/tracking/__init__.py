"""MLflow tracking: one parent run per pipeline run, one nested run per stage, the model registry.

The only package of ``aiayn`` that imports ``mlflow``, and only inside functions, so importing it
stays cheap. Stages never import it: they are handed a recorder (``aiayn.recording``), and whoever
starts a stage (``aiayn <stage>``, the Prefect stage flows) builds the MLflow one here
(``MlflowRecorder``). What a stage's run records is shaped by the ``StageRecord`` the stage opens it
with, never by knowledge of the pipeline in this package.

Each submodule holds one concern (its docstring says which); the names in each submodule's
``__all__`` are importable from here.
"""

from __future__ import annotations

from aiayn.tracking import lineage, orphans, parent, registry, registry_lock, runs, standalone, store
from aiayn.tracking.lineage import *  # noqa: F403
from aiayn.tracking.orphans import *  # noqa: F403
from aiayn.tracking.parent import *  # noqa: F403
from aiayn.tracking.registry import *  # noqa: F403
from aiayn.tracking.registry_lock import *  # noqa: F403
from aiayn.tracking.runs import *  # noqa: F403
from aiayn.tracking.standalone import *  # noqa: F403
from aiayn.tracking.store import *  # noqa: F403

__all__ = [name for module in (runs, parent, store, lineage, orphans, registry, registry_lock, standalone) for name in module.__all__]
