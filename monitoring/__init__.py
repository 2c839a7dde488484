"""Drift monitoring: production inputs of the served model against the training distribution.

- ``monitoring.descriptors``: per-sentence descriptors and encoder embeddings (pure, cheap import);
- ``monitoring.reference``: the ``monitor_reference`` DVC stage (``artifacts/monitor_reference``);
- ``monitoring.drift``: the check (Evidently reports, verdict, ``summary.json``), ``aiayn monitor``;
- ``monitoring.flows``: the Prefect flow behind the hourly deployment (``pipelines.deploy``).

Settings: the ``monitor`` block of ``params.yaml`` (``aiayn.config.MonitorConfig``). Evidently is
imported only when a check runs (its import takes seconds).
"""
