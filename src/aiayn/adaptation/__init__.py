"""Adapting the served model to its users' domain: when to adapt (``trigger``), the adapted run's data and
parameters (``adapt_plan``), the two-sided promotion gate (``promotion_gate``, pure) and the gate run that
scores challenger and champion on the same test sets and records the outcome (``gate_run``). The ``adapt``
Prefect flow (``pipelines/adapt_flow.py``) strings them together; docs/operations.md says how to use it."""
