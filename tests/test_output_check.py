"""The output check end to end on a tiny project: the reference's calibrated thresholds, a window of
logged answers judged by them, and the exit code an alarm gives (monitoring.output_check)."""

from __future__ import annotations

import json

import pytest
from support import tiny

from aiayn.config.schema import MonitorConfig, Params
from aiayn.quality.signals import SIGNALS
from aiayn.serving.request_log import SqliteRequestLog
from aiayn.tokenizer import EncodedSplit, save_encoded
from monitoring.drift import EXIT_DRIFT, exit_code, run_check, summary_exit_code
from monitoring.output_check import OUTPUT_REFERENCE, load_output_reference
from monitoring.reference import reference_dir
from monitoring.reference import run as build_reference

CFG = MonitorConfig(embedding_dims=8, window_size=60, min_window=10, embedding_sample=100, embedding_method=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    (root / "tok").mkdir()
    tok = tiny.tokenizer(root / "tok")
    layout = tiny.project(root / "project", tok)
    en = (layout.prepared / "train.en").read_text().splitlines()
    de = (layout.prepared / "train.de").read_text().splitlines()
    val_en, val_de = tiny.corpus(300, 31)  # a validation split big enough to calibrate on
    (layout.prepared / "val.en").write_text("\n".join(val_en) + "\n")
    (layout.prepared / "val.de").write_text("\n".join(val_de) + "\n")
    layout.tokenized.mkdir(parents=True)
    save_encoded(layout.tokenized, "train", EncodedSplit.from_lists(tok.encode(en), tok.encode(de)))
    (layout.tokenized / "spm.model").write_bytes((layout.model / "spm.model").read_bytes())
    params = Params(monitor=CFG)
    build_reference(params, layout)
    return {"layout": layout, "params": params, "reference": load_output_reference(reference_dir(layout))}


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
    summary, _ = run_check(params, layout, out_dir=tmp_path / "ok", track=False)
    assert summary["outputs"]["verdict"] == "ok" and summary["outputs"]["answered"] == 60
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


def test_a_window_too_small_or_without_a_reference_says_so(world, tmp_path):
    from monitoring.output_check import output_section

    assert output_section(None, [None], CFG)["verdict"] == "no_reference"
    few = output_section(world["reference"], [_in_domain(world["reference"], i) for i in range(5)], CFG)
    assert few["verdict"] == "insufficient_data" and "5 answered sentences" in few["reason"]
    nan = dict(_in_domain(world["reference"], 0), seq_logprob=float("nan"))
    many = output_section(world["reference"], [nan] * 30, CFG)  # a NaN answer is flagged, never a crash
    assert many["signals"]["seq_logprob"]["flagged"] == 30 and many["verdict"] == "alarm"
