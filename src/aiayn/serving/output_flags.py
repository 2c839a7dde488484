"""The service's count of flagged answers (``/metrics``): each answered sentence's output signals judged by the
calibrated thresholds of the drift monitor's output reference (``aiayn.quality.calibration.flags``).

The thresholds come from one file, read once at start-up: ``ServeConfig.output_reference`` (``aiayn serve
--output-reference``), else ``OUTPUT_REFERENCE_PATH`` under the working directory when it exists (a service
started in the project). They count a model's answers only when the reference was calibrated on that model:
its ``answered_by_sha256`` is the SHA-256 of the served bundle's ``bundle.json`` (a reference built from the
serving bundle) or of its ``model.safetensors`` (one built from the trained model, served as an eager
bundle). ``bundle.json`` holds the variant, runtime and decoding options, not the weights: a bundle of
another variant or decoding options is refused, a retrained model of the same variant is not told apart.
Checked again for every model the registry poller swaps in.

Without usable thresholds (no reference, or one for another model) no answer is judged: the counters stay
where they are and the gauge ``aiayn_output_thresholds_missing`` is 1. With them it is 0, and per answered
sentence with signals ``aiayn_judged_answers_total`` counts one and ``aiayn_flagged_answers_total{signal}``
one per signal that flags it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from aiayn.quality.calibration import OUTPUT_REFERENCE_PATH, flags

__all__ = ["read_output_reference", "thresholds_for", "count_flags"]

log = logging.getLogger("aiayn.serving.app")


def read_output_reference(path: Path | None) -> dict[str, Any] | None:
    """The output reference at ``path`` (``None``: ``OUTPUT_REFERENCE_PATH`` if it exists, else ``None``).
    Raises ``ValueError`` naming the file when a given ``path`` is missing or not an output reference; the
    default one, when unreadable, is logged and left out."""
    given = path is not None
    path = Path(path) if given else OUTPUT_REFERENCE_PATH
    if not given and not path.is_file():
        log.info("no output reference at %s: flagged answers are not counted (--output-reference)", path)
        return None
    try:
        reference = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(reference, dict) or not isinstance(reference.get("thresholds"), dict):
            raise ValueError("no 'thresholds' object")
    except (OSError, ValueError) as e:
        message = f"output reference {path} is unusable ({e}): build it with `dvc repro monitor_reference`"
        if given:
            raise ValueError(message) from None
        log.warning("%s; flagged answers are not counted", message)
        return None
    return reference


def thresholds_for(reference: dict[str, Any] | None, digests: frozenset[str]) -> dict[str, Any] | None:
    """The reference's thresholds when it was calibrated on the model whose file digests are ``digests``
    (``ServedModel.digests``; module docstring), else ``None`` (logged)."""
    if reference is None:
        return None
    if reference.get("answered_by_sha256") not in digests:
        log.warning("the output reference was calibrated on another model (%s, sha256 %s): flagged answers are "
                    "not counted for this one", reference.get("answered_by"),
                    str(reference.get("answered_by_sha256"))[:12])
        return None
    return reference["thresholds"]


def count_flags(signals: list[dict[str, Any] | None], thresholds: dict[str, Any] | None, *, judged,
                flagged) -> None:
    """Count the answered sentences' ``signals`` (``None``: a blank line, not judged) into the Prometheus
    counters ``judged`` and ``flagged`` (label ``signal``); nothing without ``thresholds``."""
    if thresholds is None:
        return
    for row in signals:
        if row is None:
            continue
        judged.inc()
        for name, bad in flags(row, thresholds).items():
            if bad:
                flagged.labels(name).inc()
