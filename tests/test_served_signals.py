"""The service logs what it answered: every answered sentence's output and output signals land in the
request log beside its source (aiayn.serving.app -> aiayn.quality.signals -> aiayn.serving.request_log), and
/metrics counts the answers each signal flags when the output reference's thresholds are the served model's
(aiayn.serving.output_flags)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from support import tiny

from aiayn.inference.runtimes import DecodeOptions
from aiayn.quality.signals import SIGNALS
from aiayn.serving.app import create_app
from aiayn.serving.config import ServeConfig
from aiayn.serving.request_log import open_request_log

OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.2, max_len_b=6)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    return tiny.ct2_bundle(root, layout, tok, OPTIONS)


def _translate(client, sentences: list[str]) -> list[str]:
    """POST /translate with ``sentences``; the answered translations (a 200 asserted)."""
    r = client.post("/translate", content=json.dumps({"sentences": sentences}), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()["translations"]


@pytest.mark.parametrize("scores", [True, False])
def test_answers_are_logged_with_their_signals(bundle, tmp_path, scores):
    cfg = ServeConfig(bundle=bundle, log_path=tmp_path / "requests.db", poll_s=0, scores=scores)
    sentences = ["a b c d", "", "e f g"]
    with TestClient(create_app(cfg)) as client:
        answered = _translate(client, sentences)
    with open_request_log(cfg.log_path, read_only=True) as log:
        rows = log.latest(10)
    assert [row.source for row in rows] == sentences and [row.output for row in rows] == answered
    assert rows[1].signals is None  # a blank line: nothing was translated
    for row in (rows[0], rows[2]):
        assert list(row.signals) == list(SIGNALS)
        assert (row.signals["seq_logprob"] is not None) == scores  # --no-scores: no log-probability to report
        assert row.signals["seq_logprob"] is None or row.signals["seq_logprob"] <= 0
        assert 0 <= row.signals["copy_rate"] <= 1 and row.signals["length_ratio"] >= 0


def _metrics(client) -> dict[str, float]:
    """The service's Prometheus samples: ``name`` or ``name{signal}`` -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").text
    return {s.name + (f"{{{s.labels['signal']}}}" if "signal" in s.labels else ""): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _reference(path, answered_by_sha256: str) -> None:
    """A hand-written output reference: every answer over twice its source's length flags ``length_ratio``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"answered_by": "ct2-float32", "answered_by_sha256": answered_by_sha256,
                                "thresholds": tiny.length_thresholds(2.0)}))


@pytest.mark.parametrize("reference", ["none", "this model", "another model"])
def test_metrics_count_flagged_answers_per_signal_when_the_thresholds_are_this_model_s(bundle, tmp_path, monkeypatch,
                                                                                      reference):
    from aiayn.io import sha256_file

    monkeypatch.chdir(tmp_path)  # the default reference: ./artifacts/monitor_reference/output_reference.json
    if reference != "none":
        _reference(tmp_path / "artifacts" / "monitor_reference" / "output_reference.json",
                   sha256_file(bundle / "bundle.json") if reference == "this model" else "0" * 64)
    cfg = ServeConfig(bundle=bundle, log_path=tmp_path / "requests.db", poll_s=0)
    sentences = ["a b c d", "", "e f g", "a man runs in the park with two dogs"]
    with TestClient(create_app(cfg)) as client:
        for _ in range(2):
            r = client.post("/translate", content=json.dumps({"sentences": sentences}),
                            headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
        m = _metrics(client)
    with open_request_log(cfg.log_path, read_only=True) as log:
        answered = [row.signals for row in log.latest(100) if row.signals is not None]
    longer = sum(s["length_ratio"] > 2.0 for s in answered)
    assert len(answered) == 6 and 0 < longer < 6, longer  # the count can tell judged answers apart
    counted = reference == "this model"
    assert m["aiayn_output_thresholds_missing"] == (0.0 if counted else 1.0)
    assert m["aiayn_judged_answers_total"] == (6.0 if counted else 0.0)  # blank lines are not judged
    assert m["aiayn_flagged_answers_total{length_ratio}"] == (longer if counted else 0.0)
    assert {k: v for k, v in m.items() if k.startswith("aiayn_flagged_answers_total{") and "length_ratio" not in k} \
        == {f"aiayn_flagged_answers_total{{{name}}}": 0.0 for name in SIGNALS if name != "length_ratio"}


def test_a_given_output_reference_that_is_missing_stops_the_start(bundle, tmp_path):
    cfg = ServeConfig(bundle=bundle, log_path=tmp_path / "requests.db", poll_s=0,
                      output_reference=tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"output reference .*nope\.json is unusable"):
        create_app(cfg)


def test_without_output_signals_the_answers_are_logged_and_nothing_is_judged(bundle, tmp_path, monkeypatch):
    """``aiayn serve --no-output-signals``: the answer is still logged beside its source, with no signals, and
    /metrics judges nothing even with this model's thresholds present."""
    from aiayn.io import sha256_file

    monkeypatch.chdir(tmp_path)
    _reference(tmp_path / "artifacts" / "monitor_reference" / "output_reference.json", sha256_file(bundle / "bundle.json"))
    cfg = ServeConfig(bundle=bundle, log_path=tmp_path / "requests.db", poll_s=0, output_signals=False)
    sentences = ["a b c d", "", "e f g"]
    with TestClient(create_app(cfg)) as client:
        answered = _translate(client, sentences)
        m = _metrics(client)
    with open_request_log(cfg.log_path, read_only=True) as log:
        rows = log.latest(10)
    assert [row.source for row in rows] == sentences and [row.output for row in rows] == answered
    assert [row.signals for row in rows] == [None, None, None]
    assert m["aiayn_output_thresholds_missing"] == 0.0 and m["aiayn_judged_answers_total"] == 0.0
