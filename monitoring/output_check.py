"""The output check: what the served model answered, against its answers to in-domain text.

The drift check (``monitoring.drift``) asks whether the *inputs* moved. This one asks whether the
*answers* look broken: the output signals of ``aiayn.quality.signals`` (Seq-Logprob, length ratio,
repetition, copying, output language, unknown input), per sentence.

- **Reference** (``build_output_reference``, run by the ``monitor_reference`` stage): the serving
  bundle (``artifacts/export``: the model that ships, quantized; the trained model in a project
  without one) translates the validation split as the service would (its decoding options, the ``split`` long-line policy); the signals of those
  answers give each signal's threshold at ``monitor.output_false_flag_rate`` (``aiayn.quality.
  calibration.calibrate``). Written to ``artifacts/monitor_reference/output_reference.json`` with the
  signal values (for the report) and logged to MLflow.
- **Check** (``output_section``, part of every ``aiayn monitor`` run): the window's answers with
  their logged signals (a window from ``--input FILE`` is translated by the bundle first) are flagged
  per signal, and each signal's flagged share is tested against the calibrated rate
  (``window_test`` at ``monitor.output_alpha``). Verdict: ``alarm`` when any signal alarms, ``ok``
  otherwise, ``insufficient_data`` below ``monitor.min_window`` answered sentences,
  ``no_reference`` when the reference predates output signals (rebuild it: ``dvc repro
  monitor_reference``). Only ``alarm`` changes the exit code (``monitoring.drift.summary_exit_code``).
- **Report** (``output_report``, ``outputs.html`` beside the drift check's ``report.html`` when the window
  was judged): Evidently's ``ValueStats`` of every signal, window against the reference's answers, and per
  calibrated signal the count of flagged answers (``SumValue`` of a 0/1 column ``flagged_<signal>``) tested
  against the largest count the binomial test lets pass (``alarm_count``): Evidently's test fails exactly
  when the signal alarms, and the check refuses a report that disagrees with its verdict.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.config.schema import MonitorConfig, Params
from aiayn.quality.calibration import calibrate, flags, window_test
from aiayn.quality.signals import SIGNALS, LanguageScorer, line_signals
from aiayn.stages import Layout

__all__ = ["OUTPUT_REFERENCE", "OUTPUT_VERDICTS", "alarm_count", "answer_signals", "build_output_reference",
           "load_output_reference", "output_report", "output_section", "served_translator"]

log = logging.getLogger("aiayn.monitor")

#: The output reference's file in ``artifacts/monitor_reference``.
OUTPUT_REFERENCE = "output_reference.json"
OUTPUT_VERDICTS = ("ok", "alarm", "insufficient_data", "no_reference")


def served_translator(params: Params, layout: Layout) -> tuple[Any, Any, str]:
    """``(translator, decoding options, what)``: the serving bundle (``artifacts/export``) as the service
    loads it, or, in a project without one, the trained model (``artifacts/model``) with the
    ``evaluate`` block's options. ``what``: the bundle's variant, or ``"model"``."""
    from aiayn.inference.load import load
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.inference.translator import Translator

    if (layout.export / "bundle.json").is_file():
        predictor = load(layout.export)
        return predictor.translator, predictor.options, predictor.info.get("variant", "bundle")
    if not (layout.model / "model.json").is_file():
        raise FileNotFoundError(f"neither {layout.export / 'bundle.json'} nor {layout.model / 'model.json'} exists: "
                                "run the export stage first (`dvc repro export`)")
    return Translator.from_dir(layout.model, device="cpu"), DecodeOptions.from_eval(params.evaluate), "model"


def answer_signals(translator: Any, options: Any, sentences: Sequence[str],
                   target_lang: str) -> tuple[list[str], list[dict | None]]:
    """Translate ``sentences`` as the service does (``translator``/``options``: ``served_translator``);
    returns the answers and, per sentence, its signals (``None`` for a blank line)."""
    tr = translator
    prepared = tr.prepare(list(sentences), options, long="split", warn_unknown=False)
    hyps = tr.decoder.translate_hyps(prepared.units, options, n_best=1)
    texts = [ln[0].text for ln in tr.scored_lines(prepared.spans, hyps, len_penalty=options.len_penalty)]
    signals = line_signals(prepared.spans, prepared.units, hyps, texts, scored=True, target_lang=target_lang,
                           language=LanguageScorer())
    return texts, signals


def build_output_reference(params: Params, layout: Layout) -> dict[str, Any]:
    """The output reference (module doc) as a JSON-ready dict. Raises ``FileNotFoundError`` when the
    validation split or any model is missing."""
    from aiayn.data.readers import read_lines
    from aiayn.io import sha256_file

    d, m = params.data, params.monitor
    valid = layout.prepared / f"{d.valid_split}.{d.src_lang}"
    if not valid.is_file():
        raise FileNotFoundError(f"{valid} not found: run the prepare stage first (`dvc repro prepare`)")
    sentences = read_lines(valid)
    translator, options, what = served_translator(params, layout)
    _, rows = answer_signals(translator, options, sentences, d.tgt_lang)
    thresholds = calibrate(rows, false_flag_rate=m.output_false_flag_rate)
    model_file = layout.export / "bundle.json" if what != "model" else layout.model / "model.safetensors"
    return {
        "format": "aiayn-output-reference/1",
        "split": d.valid_split,
        "sentences": len(sentences),
        "tgt_lang": d.tgt_lang,
        "answered_by": what,
        "answered_by_sha256": sha256_file(model_file),
        "false_flag_rate": m.output_false_flag_rate,
        "thresholds": thresholds,
        "values": {name: [None if r is None else r.get(name) for r in rows] for name in SIGNALS},
    }


def load_output_reference(reference_dir: Path) -> dict[str, Any] | None:
    """The output reference in ``reference_dir``, or ``None`` when it has none (an older reference)."""
    path = Path(reference_dir) / OUTPUT_REFERENCE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def output_section(reference: dict[str, Any] | None, signals: Sequence[dict | None] | None,
                   cfg: MonitorConfig) -> dict[str, Any]:
    """The summary's ``outputs`` section for one window (module doc): ``verdict``, ``answered`` (judged
    answers), ``signals`` (per signal: n, flagged, share, expected, p_value, alarm), ``alarms``."""
    if reference is None:
        return {"verdict": "no_reference", "reason": "the drift reference has no output reference: rebuild it "
                "with `dvc repro monitor_reference`"}
    if signals is None:
        return {"verdict": "insufficient_data", "answered": 0, "reason": "no answers in the window"}
    thresholds = reference["thresholds"]
    judged = [flags(s, thresholds) for s in signals if s is not None]
    section: dict[str, Any] = {"verdict": "insufficient_data", "answered": len(judged), "alpha": cfg.output_alpha,
                               "false_flag_rate": reference["false_flag_rate"], "signals": {}, "alarms": []}
    if len(judged) < cfg.min_window:
        section["reason"] = f"{len(judged)} answered sentences < monitor.min_window {cfg.min_window}: no verdict"
        return section
    tests = window_test(judged, thresholds, alpha=cfg.output_alpha)
    alarms = [name for name, t in tests.items() if t["alarm"]]
    section.update(verdict="alarm" if alarms else "ok", signals=tests, alarms=alarms)
    return section


def alarm_count(n: int, t: dict[str, Any], level: float) -> int | None:
    """The fewest flagged answers out of ``n`` that alarm a signal calibrated as ``t`` at the per-signal
    ``level`` (``window_test``: ``P(X >= k | n, in_domain_rate(t)) < level``); ``None`` when no count can."""
    import numpy as np
    from scipy.stats import binom

    from aiayn.quality.calibration import in_domain_rate

    k = np.arange(n + 1)
    hit = np.nonzero(binom.sf(k - 1, n, in_domain_rate(t)) < level)[0] if n else np.array([], dtype=int)
    return int(hit[0]) if hit.size else None


def _frame(rows: Sequence[dict | None], thresholds: dict[str, Any]):
    """One row per answered sentence: every signal (NaN where it has no value) and ``flagged_<signal>`` 0/1."""
    import pandas as pd

    answered = [r for r in rows if r is not None]
    columns = {name: [r.get(name) for r in answered] for name in SIGNALS}
    judged = [flags(r, thresholds) for r in answered]
    columns |= {f"flagged_{name}": [int(j[name]) for j in judged] for name in thresholds}
    return pd.DataFrame(columns, dtype="float64")


def output_report(reference: dict[str, Any], signals: Sequence[dict | None], section: dict[str, Any]):
    """Evidently's report of a judged window (module doc): ``(snapshot, failed)``, ``failed`` the signals whose
    count test failed (the section's ``alarms``, when Evidently agrees with ``window_test``)."""
    import os

    os.environ.setdefault("DO_NOT_TRACK", "1")  # Evidently's telemetry
    import evidently as ev
    from evidently.metrics import SumValue
    from evidently.presets import ValueStats
    from evidently.tests import lte

    thresholds = reference["thresholds"]
    ref_rows = [dict(zip(SIGNALS, values)) for values in zip(*(reference["values"][n] for n in SIGNALS))]
    cur, ref = _frame(signals, thresholds), _frame([r if any(v is not None for v in r.values()) else None
                                                    for r in ref_rows], thresholds)
    level = section["alpha"] / len(thresholds)
    counts = []
    for name in thresholds:
        k = alarm_count(section["answered"], thresholds[name], level)
        counts.append(SumValue(column=f"flagged_{name}", tests=[lte(section["answered"] if k is None else k - 1)]))
    stats = [ValueStats(column=name) for name in SIGNALS if cur[name].notna().any() and ref[name].notna().any()]
    definition = ev.DataDefinition(numerical_columns=list(cur.columns))
    snapshot = ev.Report(stats + counts, include_tests=False).run(
        current_data=ev.Dataset.from_pandas(cur, data_definition=definition),
        reference_data=ev.Dataset.from_pandas(ref, data_definition=definition))
    d = snapshot.dict()
    column = {m["id"]: m["config"].get("column") for m in d["metrics"]}
    failed = sorted(column[t["metric_config"]["metric_id"]].removeprefix("flagged_") for t in d["tests"]
                    if t["status"] == "FAIL")
    return snapshot, failed
