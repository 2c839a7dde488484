"""The pipeline's stages, in DAG order (``dvc.yaml``), and the module holding each stage's ``run``.

The orchestrator's knowledge, not the core's: the core's stages live in ``aiayn.stages``, the drift
monitor's reference stage in ``monitoring``.
"""

from __future__ import annotations

__all__ = ["STAGES", "STAGE_MODULES", "stage_module"]

#: Pipeline order (DVC DAG).
STAGES = ("corpus", "prepare", "tokenize", "train", "evaluate", "quantize", "export", "monitor_reference")

#: Stages whose module is not ``aiayn.stages.<name>``.
STAGE_MODULES = {"monitor_reference": "monitoring.reference"}


def stage_module(name: str) -> str:
    """Module holding stage ``name``'s ``run(params, layout, recorder)`` (``-`` and ``_`` alike)."""
    name = name.replace("-", "_")
    return STAGE_MODULES.get(name, f"aiayn.stages.{name}")
