"""Kill points for the fault campaign (``tests/test_fault_campaign.py``): inert unless a test arms one.

``fault_point(name)`` sits between two writes whose order matters (a tensor file and the JSON that
commits it, a temporary file and its rename, a folder and the metrics beside it, rows and their
``COMMIT``). It does nothing unless ``AIAYN_FAULT_POINT`` (``aiayn.config.settings.FAULT_POINT_ENV``)
names it; then the process sends itself SIGKILL there, as ``kill -9`` at that instant would: no
``except``, ``finally`` or ``atexit`` code runs. ``name@N`` kills at the N-th time the point is reached
in the process (``name`` alone: the first). The variable is read once per process, on the first call.

``POINTS`` lists every point placed in the code, with where it is.
"""

from __future__ import annotations

import os
import signal

__all__ = ["fault_point", "POINTS"]

#: Every kill point: name -> where it fires. ``atomic_dir:<folder name>`` is one per output folder.
POINTS = {
    "corpus.snapshot_written": "aiayn.stages.corpus: the snapshot folder complete, not yet swapped in",
    "prepare.folder_swapped": "aiayn.stages.prepare: artifacts/prepared swapped in, prepare_report.json not written",
    "tokenize.split_encoded": "aiayn.stages.tokenize: a split's encoded files written, the next split's not",
    "checkpoint.tensors_unrenamed": "aiayn.checkpoint: the tensor file written to its temporary name, not renamed",
    "checkpoint.tensors_written": "aiayn.checkpoint: the tensor file renamed into place, its JSON (the commit) not written",
    "evaluate.metrics_written": "aiayn.stages.evaluate: eval_metrics.json written, the plot file not; the run open",
    "quantize.ct2_converted": "aiayn.quantize.variants: a CTranslate2 model converted, spm.model not copied beside it",
    "quantize.variant_unrecorded": "aiayn.stages.quantize: a variant's model folder built, its variant.json not written",
    "bundle.model_copied": "aiayn.export.bundle: the model files copied into the bundle, bundle.json and the card not",
    "atomic_dir:<name>": "aiayn.io.atomic_dir: the temporary folder for <name> complete, not yet swapped in",
    "monitor_reference.tensors_written": "monitoring.reference: reference.safetensors written, its JSON files not",
    "request_log.rows_inserted": "aiayn.serving.request_log: a request's rows inserted, not committed",
}

_UNREAD = object()
_armed: object = _UNREAD  # (name, n) once read; None when no point is armed
_reached: dict[str, int] = {}


def _read() -> tuple[str, int] | None:
    from aiayn.config.settings import Settings

    try:
        value = Settings.from_env().fault_point
    except ValueError:  # another AIAYN_* variable is malformed: that is its reader's error to report
        return None
    if not value:
        return None
    name, _, n = value.partition("@")
    return name, int(n) if n.isdigit() and int(n) > 0 else 1


def fault_point(name: str) -> None:
    """SIGKILL this process when ``AIAYN_FAULT_POINT`` arms ``name`` (module doc); otherwise nothing."""
    global _armed
    if _armed is _UNREAD:
        _armed = _read()
    if _armed is None or _armed[0] != name:  # type: ignore[index]
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == _armed[1]:  # type: ignore[index]
        os.kill(os.getpid(), signal.SIGKILL)
