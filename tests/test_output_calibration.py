"""Calibrated thresholds of the output signals and the window test (aiayn.quality.calibration)."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.quality.calibration import calibrate, flags, window_test


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    """In-domain-like answers: a normal Seq-Logprob, a length ratio near 1.1, little repetition."""
    return [{"seq_logprob": float(rng.normal(-0.6, 0.15)), "length_ratio": float(rng.normal(1.1, 0.15)),
             "repeat_ngram": int(rng.integers(0, 3)), "top_piece_share": float(rng.uniform(0.05, 0.2)),
             "copy_rate": float(rng.uniform(0, 0.1)), "target_language_prob": float(rng.uniform(0.95, 1.0)),
             "source_unknown_share": 0.0} for _ in range(n)]


def test_thresholds_leave_at_most_the_stated_share_of_in_domain_answers_flagged():
    rows = _rows(np.random.default_rng(0), 1000)
    thresholds = calibrate(rows, false_flag_rate=0.02)
    assert thresholds["seq_logprob"]["tail"] == "low" and "high" not in thresholds["seq_logprob"]
    assert {"low", "high"} <= set(thresholds["length_ratio"])
    for name, t in thresholds.items():
        assert t["flag_rate"] <= 0.02, name
        assert t["flag_rate"] == np.mean([flags(r, {name: t})[name] for r in rows])
    assert thresholds["seq_logprob"]["flag_rate"] == pytest.approx(0.02, abs=0.002)  # continuous: the rate itself


def test_a_broken_answer_is_flagged_by_the_signal_made_for_it():
    thresholds = calibrate(_rows(np.random.default_rng(1), 500), false_flag_rate=0.02)
    loop = {"seq_logprob": -0.7, "length_ratio": 3.0, "repeat_ngram": 20, "top_piece_share": 0.5, "copy_rate": 0.0,
            "target_language_prob": 0.99, "source_unknown_share": 0.0}
    copy = {"seq_logprob": -0.3, "length_ratio": 1.0, "repeat_ngram": 1, "top_piece_share": 0.1, "copy_rate": 1.0,
            "target_language_prob": 0.01, "source_unknown_share": 0.0}
    assert {k for k, v in flags(loop, thresholds).items() if v} == {"length_ratio", "repeat_ngram", "top_piece_share"}
    assert {k for k, v in flags(copy, thresholds).items() if v} == {"copy_rate", "target_language_prob"}
    assert flags(None, thresholds) == {}  # a blank line: nothing answered, nothing flagged
    broken = dict(loop, seq_logprob=float("nan"), target_language_prob=None)
    assert flags(broken, thresholds)["seq_logprob"] and flags(broken, thresholds)["target_language_prob"]
    assert not flags(dict(copy, seq_logprob=None), thresholds)["seq_logprob"]  # unscored by design


def test_in_domain_windows_rarely_alarm_and_a_shifted_window_does():
    rng = np.random.default_rng(2)
    thresholds = calibrate(_rows(rng, 1014), false_flag_rate=0.02)
    alarms = 0
    for seed in range(200):
        window = [flags(r, thresholds) for r in _rows(np.random.default_rng(100 + seed), 200)]
        alarms += any(v["alarm"] for v in window_test(window, thresholds, alpha=0.05).values())
    assert alarms / 200 <= 0.05  # the Bonferroni level holds the window's false-alarm rate
    shifted = _rows(rng, 200)
    for r in shifted[:30]:  # 15 % of the answers in the wrong language
        r["target_language_prob"] = 0.02
    result = window_test([flags(r, thresholds) for r in shifted], thresholds, alpha=0.05)
    assert result["target_language_prob"]["alarm"] and result["target_language_prob"]["flagged"] >= 30


def test_calibration_refuses_a_useless_rate_or_no_answers():
    with pytest.raises(ValueError, match="false_flag_rate"):
        calibrate(_rows(np.random.default_rng(0), 10), false_flag_rate=0.6)
    with pytest.raises(ValueError, match="no output signals"):
        calibrate([None, None], false_flag_rate=0.02)
