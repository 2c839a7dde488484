"""The output check end to end on a tiny project: the reference's calibrated thresholds, a window of
logged answers judged by them, and the exit code an alarm gives (monitoring.output_check)."""

from __future__ import annotations

import json

import pytest
from support import tiny

from aiayn.config.schema import MonitorConfig
from aiayn.quality.calibration import window_test
from aiayn.quality.signals import SIGNALS
from aiayn.serving.request_log import SqliteRequestLog
from monitoring.drift import EXIT_DRIFT, exit_code, run_check, summary_exit_code
from monitoring.output_check import OUTPUT_REFERENCE, load_output_reference
from monitoring.reference import reference_dir

CFG = MonitorConfig(embedding_dims=8, window_size=60, min_window=10, embedding_sample=100, embedding_method=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    # a validation split big enough to calibrate on
    world = tiny.monitored_project(tmp_path_factory.mktemp("outputs"), CFG, val=300)
    return world | {"reference": load_output_reference(reference_dir(world["layout"]))}


def test_the_reference_holds_calibrated_thresholds_for_every_signal(world):
    ref = world["reference"]
    assert (reference_dir(world["layout"]) / OUTPUT_REFERENCE).is_file()
    assert ref["sentences"] == 300 and ref["answered_by"] == "model" and ref["false_flag_rate"] == 0.02
    assert set(ref["thresholds"]) == set(SIGNALS)
    for name, t in ref["thresholds"].items():  # in-domain validation answers stay under the false-flag rate
        assert t["flag_rate"] <= 0.02, (name, t)
        assert len(ref["values"][name]) == 300


def _log(path, rows: list[dict]) -> None:
    with SqliteRequestLog(path) as log:
        for i, sig in enumerate(rows):
            log.write(f"r{i}", ts=1000.0 + i, model={"name": "m", "version": "1", "variant": "x"}, beam_size=2,
                      sources=[f"a sentence {i}"], source_tokens=[5], output_tokens=[5], outputs=[f"Antwort {i}"],
                      signals=[sig])


def _in_domain(ref: dict, i: int) -> dict:
    return {name: ref["values"][name][i % len(ref["values"][name])] for name in SIGNALS}


def test_in_domain_answers_pass_and_copied_english_answers_alarm(world, tmp_path):
    ref, layout = world["reference"], world["layout"]
    params = world["params"].model_copy(update={"monitor": CFG.model_copy(update={"log_path": str(tmp_path / "a.db")})})
    _log(tmp_path / "a.db", [_in_domain(ref, i) for i in range(60)])
    summary, folder = run_check(params, layout, out_dir=tmp_path / "ok", track=False)
    assert summary["outputs"]["verdict"] == "ok" and summary["outputs"]["answered"] == 60
    assert (folder / "outputs.html").stat().st_size > 10_000  # Evidently's report of the answers' signals
    assert summary_exit_code(summary) == exit_code(summary["verdict"])  # the answers change nothing here

    broken = [_in_domain(ref, i) for i in range(60)]
    for row in broken[:20]:  # a third of the answers: the source copied through, in the wrong language
        row.update(copy_rate=1.0, target_language_prob=0.001)
    params = params.model_copy(update={"monitor": CFG.model_copy(update={"log_path": str(tmp_path / "b.db")})})
    _log(tmp_path / "b.db", broken)
    summary, folder = run_check(params, layout, out_dir=tmp_path / "alarm", track=False)
    out = summary["outputs"]
    assert out["verdict"] == "alarm" and {"copy_rate", "target_language_prob"} <= set(out["alarms"])
    assert summary_exit_code(summary) == EXIT_DRIFT
    assert json.loads((folder / "summary.json").read_text())["outputs"]["verdict"] == "alarm"
    assert (folder / "outputs.html").is_file()


def test_the_report_s_count_tests_fail_exactly_for_the_signals_that_alarm(world):
    """outputs.html's tests: per signal, flagged answers <= the most the binomial test lets pass, so Evidently's
    verdict is the window test's, signal by signal."""
    from monitoring.output_check import alarm_count, output_report, output_section

    ref = world["reference"]
    rows = [_in_domain(ref, i) for i in range(60)]
    for row in rows[:20]:
        row.update(copy_rate=1.0)
    section = output_section(ref, rows, CFG)
    assert section["alarms"] == ["copy_rate"]
    snapshot, failed = output_report(ref, rows, section)
    assert failed == ["copy_rate"] and snapshot.dict()["tests"]
    level = CFG.output_alpha / len(ref["thresholds"])
    k = alarm_count(60, ref["thresholds"]["copy_rate"], level)
    assert 0 < k <= 20
    for flagged, alarm in ((k - 1, False), (k, True)):  # the count the test is drawn at is the alarm's edge
        t = window_test([{"copy_rate": i < flagged} for i in range(60)], {"copy_rate": ref["thresholds"]["copy_rate"]},
                        alpha=level)
        assert t["copy_rate"]["alarm"] is alarm


def test_a_window_too_small_or_without_a_reference_says_so(world, tmp_path):
    from monitoring.output_check import output_section

    assert output_section(None, [None], CFG)["verdict"] == "no_reference"
    few = output_section(world["reference"], [_in_domain(world["reference"], i) for i in range(5)], CFG)
    assert few["verdict"] == "insufficient_data" and "5 answered sentences" in few["reason"]
    nan = dict(_in_domain(world["reference"], 0), seq_logprob=float("nan"))
    many = output_section(world["reference"], [nan] * 30, CFG)  # a NaN answer is flagged, never a crash
    assert many["signals"]["seq_logprob"]["flagged"] == 30 and many["verdict"] == "alarm"
