"""Prefect orchestration of the aiayn stages: the pipeline's stages and their order, one flow per
stage, the ``pipeline`` flow (``dvc repro`` -> ``dvc push`` -> report), the drift-check flow, and the
deployments that schedule them.

The pure core (``src/aiayn``) never imports Prefect or DVC; everything here is a wrapper over the
same stage functions the CLI calls.

Importing ``pipelines`` changes nothing in the process. ``apply_project_env`` sets the settings
every process that runs a flow needs (``PROJECT_ENV_DEFAULTS``); the mains (``python -m
pipelines.<module>``) call it first, and the modules that import Prefect call it just before, since
Prefect reads its settings once, when it is imported (a deployment's flow run imports its flow's
module directly). So ``dvc repro``, ``python -m pipelines.run_stage``, the worker and ``make run``
behave alike, with no Makefile or shell setup.
"""

import os as _os

#: Set by ``apply_project_env`` unless already set (a value the user set wins).
PROJECT_ENV_DEFAULTS = {
    # a cold temporary API (fresh database, 2 busy cores) needs more than Prefect's 20 s default
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # no telemetry from Prefect's server, DVC or anything honouring the DO_NOT_TRACK convention
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
}


def apply_project_env(stage: str | None = None) -> None:
    """Set ``PROJECT_ENV_DEFAULTS`` and aiayn's process defaults (``aiayn.config.settings``; ``stage``: the one
    stage this process runs, if any: only ``python -m pipelines.run_stage`` knows it) in ``os.environ``,
    each unless already set; then, when Prefect will start a temporary API server, have it start in a
    session of its own, so a terminal's Ctrl-C stops the flow cleanly instead of killing the API the
    flow reports to (``pipelines.prefect_api``)."""
    from aiayn.config.settings import apply_process_defaults

    for key, value in PROJECT_ENV_DEFAULTS.items():
        _os.environ.setdefault(key, value)
    apply_process_defaults(stage=stage)

    from pipelines.prefect_api import keep_temporary_api_out_of_the_group

    keep_temporary_api_out_of_the_group()  # imports Prefect: after the settings above
