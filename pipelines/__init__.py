"""Prefect orchestration of the aiayn stages.

``flows``     one thin flow per stage (fetch, prepare, tokenize, train, evaluate)
``stage``     ``python -m pipelines.stage <name>``: what each ``dvc.yaml`` cmd runs
``pipeline``  the ``pipeline`` flow: ``dvc repro`` -> ``dvc push`` -> markdown report
``deploy``    deployments, schedules and the work pool, kept apart from flow code
``scratch``   a throwaway copy of the project (smoke runs, tests, benchmarks)

The pure core (``src/aiayn``) never imports Prefect or DVC; everything here is a
wrapper over the same ``aiayn.stages.<name>.run`` the CLI calls.
"""

import os as _os

#: Settings every entry point that starts a flow needs, applied when ``pipelines`` is first
#: imported (before Prefect is): ``dvc repro``, ``python -m pipelines.stage``, the worker and
#: ``make run`` behave alike, with no Makefile or shell setup. A value the user already set wins.
PROJECT_ENV_DEFAULTS = {
    # a cold temporary API (fresh database, 2 busy cores) needs more than Prefect's 20 s default
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # no telemetry from Prefect's server, DVC or anything honouring the DO_NOT_TRACK convention
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
}
for _key, _value in PROJECT_ENV_DEFAULTS.items():
    _os.environ.setdefault(_key, _value)
