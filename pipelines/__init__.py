"""Prefect orchestration of the aiayn stages.

``flows``     one thin flow per stage (fetch, prepare, tokenize, train, evaluate)
``stage``     ``python -m pipelines.stage <name>``: what each ``dvc.yaml`` cmd runs
``pipeline``  the ``pipeline`` flow: ``dvc repro`` -> ``dvc push`` -> markdown report
``deploy``    deployments, schedules and the work pool, kept apart from flow code
``scratch``   a throwaway copy of the project (smoke runs, tests, benchmarks)

The pure core (``src/aiayn``) never imports Prefect or DVC; everything here is a
wrapper over the same ``aiayn.stages.<name>.run`` the CLI calls.
"""
