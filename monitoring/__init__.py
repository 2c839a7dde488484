"""Drift monitoring: production inputs of the served model against the training distribution.

The monitor's core: per-sentence descriptors and encoder embeddings, the reference they are
compared against (the ``monitor_reference`` DVC stage), the check (Evidently reports, a verdict,
``summary.json``), the human review queue of flagged answers (``monitoring.review``) and its
``aiayn`` commands. No Prefect here: the scheduled drift-check flow is the
orchestrator's (``pipelines.drift_flow``).

Settings: the ``monitor`` block of ``params.yaml`` (``aiayn.config.schema.MonitorConfig``). Evidently is
imported only when a check runs (its import takes seconds).
"""
