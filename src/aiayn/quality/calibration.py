"""Thresholds for the output signals, calibrated on in-domain answers, and the window test on them.

Each signal of ``aiayn.quality.signals`` has a bad tail (``TAILS``): low ``seq_logprob`` and
``target_language_prob``, high repetition, copying and unknown input, and both tails of
``length_ratio``. ``calibrate`` takes the signals of the served model's answers to in-domain text
(the validation split) and puts each threshold at the empirical quantile that leaves at most
``false_flag_rate`` of those answers beyond it (strictly beyond: a tie at the threshold is not
flagged, so the in-domain rate never exceeds the stated one; a two-tailed signal spends half of it
on each tail). ``flags`` applies the thresholds to one answer: a missing or non-finite value of a
signal that was computed is flagged too (NaN scores, an empty answer).

``window_test`` asks, per signal, whether a window of answers is flagged more often than the
calibrated rate allows: the one-sided binomial tail ``P(X >= k | n, rate)`` of ``k`` flagged answers
out of ``n``, an alarm below ``alpha / len(signals)`` (Bonferroni over the signals, so the window's
false-alarm rate stays below ``alpha`` when the answers are in-domain). The in-domain rate is the one
the calibration answers were flagged at, taken at its 95 % upper confidence bound (``in_domain_rate``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta, binom

from aiayn.quality.signals import SIGNALS

__all__ = ["TAILS", "OUTPUT_REFERENCE_PATH", "calibrate", "flags", "in_domain_rate", "window_test"]

#: Where the drift monitor's ``monitor_reference`` stage writes the calibrated thresholds (with the signal
#: values they came from: ``monitoring.output_check``), relative to the project root; ``reference.json``
#: beside it names the trained model it was built for.
OUTPUT_REFERENCE_PATH = Path("artifacts") / "monitor_reference" / "output_reference.json"

#: The bad tail of each signal: ``low``, ``high`` or ``both``.
TAILS: dict[str, str] = {
    "seq_logprob": "low", "length_ratio": "both", "repeat_ngram": "high", "top_piece_share": "high",
    "copy_rate": "high", "target_language_prob": "low", "source_unknown_share": "high",
}


def _values(rows: Iterable[Mapping[str, Any] | None], name: str) -> np.ndarray:
    vals = [r[name] for r in rows if r is not None and r.get(name) is not None]
    return np.asarray(vals, dtype=np.float64)


def calibrate(rows: Sequence[Mapping[str, Any] | None], *, false_flag_rate: float) -> dict[str, dict[str, Any]]:
    """Per signal present in ``rows`` (``OutputSignals.as_dict`` of in-domain answers): its tail, the
    ``low`` and/or ``high`` threshold, the rate the calibration answers are flagged at (at most
    ``false_flag_rate``), the number of values and their quantiles. Raises ``ValueError`` for a rate
    outside (0, 0.5) or no answers."""
    if not 0 < false_flag_rate < 0.5:
        raise ValueError(f"false_flag_rate must be in (0, 0.5), got {false_flag_rate}")
    out: dict[str, dict[str, Any]] = {}
    for name in SIGNALS:
        v = _values(rows, name)
        if v.size == 0:
            continue
        tail = TAILS[name]
        share = false_flag_rate / 2 if tail == "both" else false_flag_rate
        entry: dict[str, Any] = {"tail": tail, "n": int(v.size)}
        if tail in ("low", "both"):
            entry["low"] = float(np.quantile(v, share, method="higher"))
        if tail in ("high", "both"):
            entry["high"] = float(np.quantile(v, 1 - share, method="lower"))
        flagged = [_beyond(x, entry) for x in v]
        entry["flag_rate"] = round(float(np.mean(flagged)), 6)
        q = np.quantile(v, [0.01, 0.05, 0.5, 0.95, 0.99])
        entry["quantiles"] = {p: round(float(x), 6) for p, x in zip(("p01", "p05", "p50", "p95", "p99"), q)}
        out[name] = entry
    if not out:
        raise ValueError("no output signals to calibrate on (no answered sentence)")
    return out


def _beyond(x: float, t: Mapping[str, Any]) -> bool:
    return ("low" in t and x < t["low"]) or ("high" in t and x > t["high"])


def flags(signals: Mapping[str, Any] | None, thresholds: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    """Which calibrated signals flag this answer. A value that is missing or not finite flags (a NaN
    score, a broken answer), except ``seq_logprob`` of an unscored answer, which is ``None`` by design;
    ``signals=None`` (a blank line, nothing answered) flags nothing."""
    if signals is None:
        return {}
    out = {}
    for name, t in thresholds.items():
        x = signals.get(name)
        if x is None:
            out[name] = name != "seq_logprob"
        else:
            out[name] = not math.isfinite(float(x)) or _beyond(float(x), t)
    return out


def in_domain_rate(t: Mapping[str, Any], confidence: float = 0.95) -> float:
    """The in-domain flag rate a window is tested against: the one-sided ``confidence`` upper bound
    (Clopper-Pearson) of the rate the ``n`` calibration answers were flagged at. The calibrated rate is
    itself an estimate (its threshold an empirical quantile); testing against the point estimate
    alarmed on 12 % of in-domain windows of 200 in a simulation (tests/test_output_calibration.py)."""
    n = int(t["n"])
    k = round(float(t["flag_rate"]) * n)
    return float(beta.ppf(confidence, k + 1, n - k)) if k < n else 1.0


def window_test(flag_rows: Sequence[Mapping[str, bool]], thresholds: Mapping[str, Mapping[str, Any]], *,
                alpha: float) -> dict[str, dict[str, Any]]:
    """Per calibrated signal: ``n`` judged answers, ``flagged``, the ``share`` against the calibrated
    ``expected`` rate, the binomial tail ``p_value`` and ``alarm`` (``p_value < alpha / signals``)."""
    level = alpha / max(1, len(thresholds))
    out = {}
    for name, t in thresholds.items():
        judged = [r[name] for r in flag_rows if name in r]
        n, k = len(judged), int(sum(judged))
        rate = in_domain_rate(t)
        p = float(binom.sf(k - 1, n, rate)) if n else 1.0
        out[name] = {"n": n, "flagged": k, "share": round(k / n, 6) if n else None, "expected": round(rate, 6),
                     "p_value": p, "alarm": bool(n and p < level)}
    return out
