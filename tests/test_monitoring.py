"""Drift monitor (``monitoring/``): descriptors, the reference stage, the check's verdicts and errors,
``aiayn monitor`` exit codes, the serving log as the window. A tiny En->De world (``tiny``) stands in
for the trained model; the real-shift validation on Multi30k is in ``test_monitoring_real.py``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from support import tiny
from aiayn.config.schema import MonitorConfig, Params
from aiayn.io import sha256_file
from aiayn.inference.translator import Translator
from monitoring.descriptors import DESCRIPTORS, Pca, describe, source_side_table
from monitoring.drift import (
    EXIT_CANNOT_RUN,
    EXIT_DRIFT,
    EXIT_NO_DRIFT,
    SUMMARY_SCHEMA_VERSION,
    DriftCheckError,
    check,
    load_reference,
    read_log_window,
    read_text_window,
    run_check,
)
from monitoring.reference import reference_dir
from monitoring.reference import run as build_reference

CFG = MonitorConfig(embedding_dims=8, window_size=40, min_window=10, embedding_sample=100)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A project with prepared splits, a tokenized train split, a model and its drift reference; a bigger training
    side than tiny.project's 64 pairs: the tests sample windows from its distribution."""
    world = tiny.monitored_project(tmp_path_factory.mktemp("monitor"), CFG, more_train=600)
    layout = world["layout"]
    return world | {"translator": Translator.from_dir(layout.model, device="cpu"),
                    "ref": load_reference(reference_dir(layout))}


# --------------------------------------------------------------------------- descriptors


def test_descriptors_of_a_sentence_counted_by_hand(world):
    tok = world["tok"]
    side = np.zeros(tok.vocab_size, dtype=bool)
    d = describe(["A man, 2 dogs.", "   "], tok, side)
    assert set(d) == set(DESCRIPTORS)
    # "A man, 2 dogs.": 14 characters, 11 non-space, 8 letters (1 upper), 1 digit, 4 words
    assert d["chars"][0] == 14 and d["words"][0] == 4
    assert d["non_letter_share"][0] == pytest.approx(3 / 11)
    assert d["digit_share"][0] == pytest.approx(1 / 11)
    assert d["upper_share"][0] == pytest.approx(1 / 8)
    assert d["pieces"][0] == len(tok.encode(["A man, 2 dogs."])[0])
    assert d["pieces_per_word"][0] == pytest.approx(d["pieces"][0] / 4)
    # a blank line: every descriptor 0, never NaN (a statistical test must see every row)
    assert all(v[1] == 0 and not math.isnan(v[1]) for v in d.values())


def test_nfd_and_nfc_give_the_same_descriptors(world):
    """Decomposed accents (NFD) are normalised as the tokenizer normalises them
    (NFKC), so they are not counted as non-letter characters nor as extra length."""
    import unicodedata

    tok = world["tok"]
    side = world["ref"].source_side
    text = ["Café à la crème, naïve señor", "Über zwei Hunde", "a man in the park"]
    nfc = describe([unicodedata.normalize("NFC", t) for t in text], tok, side)
    nfd = describe([unicodedata.normalize("NFD", t) for t in text], tok, side)
    assert any(unicodedata.normalize("NFD", t) != t for t in text)
    for name in DESCRIPTORS:
        np.testing.assert_array_equal(nfd[name], nfc[name], err_msg=name)
    # "Café à la crème, naïve señor": 28 characters, 23 of them not spaces, one (the comma) not a letter
    assert nfc["chars"][0] == len(text[0]) and nfc["non_letter_share"][0] == pytest.approx(1 / 23)


def test_unknown_characters_raise_the_unk_rate(world):
    tok = world["tok"]
    d = describe(["a man", "a ЖЖЖ man"], tok, np.zeros(tok.vocab_size, dtype=bool))
    assert d["unk_rate"][0] == 0 and d["unk_rate"][1] > 0


def test_source_side_table_normalises_by_side_and_never_marks_special_ids():
    # source: piece 4 twice, 5 once, EOS once; target: 5 and 6 twice each
    side = source_side_table(np.array([4, 4, 5, 3]), np.array([5, 5, 6, 6]), vocab_size=8)
    assert side.tolist() == [False, False, False, False, True, False, False, False]


def test_src_lang_score_separates_english_from_german(world):
    ref = world["ref"]
    en, de = tiny.corpus(50, 99)
    d_en = describe(en, world["tok"], ref.source_side)
    d_de = describe(de, world["tok"], ref.source_side)
    # measured 0.83 (English) and 0.08 (German): deterministic (a fixed corpus, a sentencepiece model trained on
    # a fixed one). Shared pieces (single letters, pieces both languages spell alike) keep English below 1 and
    # German above 0; each side stays within 0.2 of its own end
    assert d_en["src_lang_score"].mean() > 0.8 > 0.2 > d_de["src_lang_score"].mean()


def test_pca_is_deterministic_and_checks_dimensions():
    x = np.random.default_rng(0).normal(size=(200, 16)).astype(np.float32)
    a, b = Pca.fit(x, 4), Pca.fit(x.copy(), 4)
    assert np.array_equal(a.components, b.components) and a.transform(x).shape == (200, 4)
    with pytest.raises(ValueError, match="do not fit"):
        a.transform(x[:, :8])
    with pytest.raises(ValueError, match="PCA components"):
        Pca.fit(x[:3], 4)


# --------------------------------------------------------------------------- reference stage


def test_reference_stage_is_deterministic_and_records_its_model(world, tmp_path):
    layout, ref = world["layout"], world["ref"]
    meta = json.loads((reference_dir(layout) / "reference.json").read_text())
    assert meta["sentences"] == len(ref) == 664 and meta["embedding_dims"] == 8
    assert meta["model_sha256"] == sha256_file(layout.model / "model.safetensors")
    assert ref.embeddings.shape == (664, 8) and set(ref.descriptors) == set(DESCRIPTORS)
    first = {f: sha256_file(reference_dir(layout) / f) for f in ("reference.safetensors", "reference.json")}
    before = load_file(str(reference_dir(layout) / "reference.safetensors"))
    build_reference(world["params"], layout)
    after = load_file(str(reference_dir(layout) / "reference.safetensors"))
    assert [k for k in before if not np.array_equal(before[k], after[k])] == []
    assert {f: sha256_file(reference_dir(layout) / f) for f in first} == first


def test_reference_stage_names_the_missing_input(tmp_path):
    from aiayn.stages import Layout

    with pytest.raises(FileNotFoundError, match="run the prepare stage first"):
        build_reference(Params(), Layout(tmp_path))


# --------------------------------------------------------------------------- verdicts


def _english(n: int, seed: int) -> list[str]:
    return tiny.corpus(n, seed)[0]


def test_windows_from_the_training_distribution_are_not_flagged(world):
    verdicts = [check(_english(40, 1000 + s), world["ref"], CFG, world["translator"]).summary["verdict"]
                for s in range(10)]
    assert verdicts.count("drift") <= 1, verdicts


def test_german_window_drifts_and_names_what_moved(world):
    s = check(tiny.corpus(40, 7)[1], world["ref"], CFG, world["translator"]).summary
    assert s["verdict"] == "drift"
    assert s["descriptors"]["src_lang_score"]["drifted"]
    assert "src_lang_score" in s["drifted"]


def test_upper_cased_window_drifts(world):
    s = check([x.upper() for x in _english(40, 8)], world["ref"], CFG, world["translator"]).summary
    assert s["verdict"] == "drift" and s["descriptors"]["upper_share"]["drifted"]


def test_below_the_minimum_window_the_verdict_is_insufficient_data_never_drift(world):
    result = check(tiny.corpus(9, 7)[1], world["ref"], CFG, world["translator"])  # German, but 9 < min_window 10
    assert result.summary["verdict"] == "insufficient_data" and result.exit_code == EXIT_CANNOT_RUN
    assert result.summary["descriptors"] == {} and "min_window" in result.summary["reason"]
    with pytest.raises(DriftCheckError, match="no sentences"):
        check([], world["ref"], CFG, world["translator"])


@pytest.mark.parametrize("stattest, threshold, description", [("ks", 0.01, "K-S p_value"),
                                                              ("wasserstein", 1.0, "Wasserstein distance (normed)")])
def test_summary_schema_and_the_pinned_test_is_recorded(world, stattest, threshold, description):
    cfg = CFG.model_copy(update={"stattest": stattest, "stattest_threshold": threshold})
    s = check(_english(30, 3) + tiny.corpus(20, 7)[1], world["ref"], cfg, world["translator"]).summary
    assert s["schema_version"] == SUMMARY_SCHEMA_VERSION
    assert set(s) >= {"verdict", "window", "reference", "descriptors", "drifted_share", "drift_share", "embeddings",
                      "drifted", "seconds"}
    assert s["verdict"] in ("drift", "no_drift")
    assert list(s["descriptors"]) == list(DESCRIPTORS)
    for t in s["descriptors"].values():
        assert set(t) == {"test", "test_description", "statistic", "threshold", "drifted", "current_mean",
                          "reference_mean"}
        assert t["test"] == stattest and description in t["test_description"] and t["threshold"] == threshold
        assert isinstance(t["drifted"], bool) and t["statistic"] >= 0.0
        if stattest == "ks":  # a p-value: drift when p < threshold
            assert t["statistic"] <= 1.0 and t["drifted"] == (t["statistic"] < t["threshold"])
        else:  # a distance: drift when >= threshold
            assert t["drifted"] == (t["statistic"] >= t["threshold"])
    assert any(t["drifted"] for t in s["descriptors"].values())  # 20 German lines of 50 move src_lang_score
    e = s["embeddings"]
    assert e["method"] == "mmd" and e["dims"] == CFG.embedding_dims  # reduced before the report
    assert e["reference_rows"] == CFG.embedding_sample and e["current_rows"] == 50
    assert e["threshold"] == 0.035 and e["test"] == "drift when above 0.035"
    assert e["drifted"] == (e["statistic"] > e["threshold"])
    boot = check(_english(40, 3), world["ref"], cfg.model_copy(update={"embedding_bootstrap": True}),
                 world["translator"]).summary["embeddings"]
    assert "bootstrap" in boot["test"] and "0.95 quantile" in boot["test"] and boot["threshold"] is None


def test_per_descriptor_threshold_overrides_the_default(world):
    german = tiny.corpus(40, 7)[1]
    cfg = CFG.model_copy(update={"thresholds": {"src_lang_score": 1e-300}})
    s = check(german, world["ref"], cfg, world["translator"]).summary
    assert s["descriptors"]["src_lang_score"]["threshold"] == 1e-300
    assert s["descriptors"]["chars"]["threshold"] == CFG.stattest_threshold
    bad = CFG.model_copy(update={"thresholds": {"nope": 0.1}})
    with pytest.raises(DriftCheckError, match="nope"):
        check(german, world["ref"], bad, world["translator"])


# --------------------------------------------------------------------------- windows, run_check, CLI


def test_text_window_rejects_bad_utf8_and_skips_blank_lines(tmp_path):
    f = tmp_path / "w.txt"
    f.write_bytes(b"a man\n\nthe dog\n")
    assert read_text_window(f) == ["a man", "the dog"]
    f.write_bytes(b"a man\n\xff\xfe dog\n")
    with pytest.raises(DriftCheckError, match="line 2") as e:
        read_text_window(f)
    assert "re-encode the file as UTF-8" in str(e.value) and "--encoding-errors" not in str(e.value)
    with pytest.raises(DriftCheckError, match="cannot read"):
        read_text_window(tmp_path / "missing.txt")


def _log(path: Path, sentences: list[str], version: str = "3") -> None:
    from aiayn.serving.request_log import SqliteRequestLog as RequestLog

    rl = RequestLog(path)
    t = time.time()
    for i in range(0, len(sentences), 4):
        chunk = sentences[i: i + 4]
        rl.write(f"r{i}", ts=t + i, model={"name": "m", "version": version, "variant": "eager"}, beam_size=4,
                 sources=chunk, source_tokens=[1] * len(chunk), output_tokens=[1] * len(chunk), outputs=chunk)
    rl.close()


def test_log_window_is_the_latest_sentences_oldest_first(tmp_path):
    _log(tmp_path / "log.db", [f"s{i}" for i in range(50)])
    sentences, info = read_log_window(tmp_path / "log.db", 10)
    assert sentences == [f"s{i}" for i in range(40, 50)] and info["model_versions"] == ["3"]
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DriftCheckError, match="unreadable"):
        read_log_window(tmp_path / "junk.db", 10)
    with pytest.raises(DriftCheckError, match="no serving log"):
        read_log_window(tmp_path / "none.db", 10)


def test_run_check_on_the_serving_log_writes_reports(world, tmp_path):
    layout = world["layout"]
    log_path = tmp_path / "requests.db"
    _log(log_path, tiny.corpus(60, 5)[1])  # German traffic
    params = world["params"].model_copy(update={"monitor": CFG.model_copy(update={"log_path": str(log_path)})})
    summary, out = run_check(params, layout, out_dir=tmp_path / "report", track=False)
    assert summary["verdict"] == "drift" and summary["window"]["sentences"] == CFG.window_size
    assert summary["window"]["log"] == str(log_path)
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "report.html").stat().st_size > 10_000 and (out / "embeddings.html").is_file()


def test_a_reference_built_for_another_model_is_refused(world, tmp_path):
    import shutil

    from aiayn.stages import Layout

    other = Layout(tmp_path / "other")
    shutil.copytree(world["layout"].root, other.root)
    (tmp_path / "w.txt").write_text("\n".join(_english(20, 1)) + "\n")
    weights = other.model / "model.safetensors"
    from aiayn.checkpoint import load_model_weights, save_model

    w = load_model_weights(weights)
    save_model(weights, {k: v + 1 if v.is_floating_point() else v for k, v in w.items()})
    with pytest.raises(DriftCheckError, match="another model"):
        run_check(world["params"], other, input_path=tmp_path / "w.txt", out_dir=tmp_path / "r", track=False)


@pytest.mark.parametrize("case, code", [("english", EXIT_NO_DRIFT), ("german", EXIT_DRIFT), ("few", EXIT_CANNOT_RUN),
                                        ("empty", EXIT_CANNOT_RUN), ("missing", EXIT_CANNOT_RUN)])
def test_aiayn_monitor_exit_codes(world, tmp_path, case, code):
    import yaml
    from typer.testing import CliRunner

    from aiayn.cli.main import app

    layout = world["layout"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"monitor": CFG.model_dump(mode="json")}))
    lines = {"english": _english(40, 3), "german": tiny.corpus(40, 7)[1], "few": _english(5, 3), "empty": ["", " "]}
    window = tmp_path / "w.txt"
    if case != "missing":
        window.write_text("\n".join(lines[case]) + "\n")
    result = CliRunner().invoke(app, ["monitor", "--input", str(window), "--params", str(tmp_path / "params.yaml"),
                                      "--root", str(layout.root), "--out", str(tmp_path / "out"), "--no-track"])
    assert result.exit_code == code, result.output
    if case in ("english", "german", "few"):
        verdict = json.loads((tmp_path / "out" / "summary.json").read_text())["verdict"]
        assert verdict == {"english": "no_drift", "german": "drift", "few": "insufficient_data"}[case]
        assert result.stdout.startswith(f"{verdict}: ")
        if case == "german":  # one line per test, the drifted ones marked
            assert any(line.split()[0] == "src_lang_score" and line.endswith("DRIFT") for line in result.stdout.splitlines())
    else:
        assert "error" in result.output and not (tmp_path / "out").exists()


def test_aiayn_monitor_json_prints_the_summary(world, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from aiayn.cli.main import app

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"monitor": CFG.model_dump(mode="json")}))
    (tmp_path / "w.txt").write_text("\n".join(_english(40, 3)) + "\n")
    result = CliRunner().invoke(app, ["monitor", "--input", str(tmp_path / "w.txt"), "--json", "--no-track",
                                      "--params", str(tmp_path / "params.yaml"), "--root", str(world["layout"].root),
                                      "--out", str(tmp_path / "out")])
    assert json.loads(result.stdout) == json.loads((tmp_path / "out" / "summary.json").read_text())


def test_a_drift_check_is_logged_to_mlflow(world, tmp_path):
    from mlflow import MlflowClient

    from aiayn.tracking import DRIFT_EXPERIMENT, log_drift_check

    s = check(tiny.corpus(40, 7)[1], world["ref"], CFG, world["translator"]).summary
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "summary.json").write_text(json.dumps(s))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = log_drift_check(tmp_path, s, tmp_path / "rep", tracking_uri=uri)
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == DRIFT_EXPERIMENT
    assert run.data.tags["drift.verdict"] == "drift" and run.data.metrics["drift"] == 1.0
    assert run.data.metrics["src_lang_score.drifted"] == 1.0
    assert [a.path for a in client.list_artifacts(run_id, "drift")] == ["drift/summary.json"]
