"""The service logs what it answered: every answered sentence's output and output signals land in the
request log beside its source (aiayn.serving.app -> aiayn.quality.signals -> aiayn.serving.request_log)."""

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


@pytest.mark.parametrize("scores", [True, False])
def test_answers_are_logged_with_their_signals(bundle, tmp_path, scores):
    cfg = ServeConfig(bundle=bundle, log_path=tmp_path / "requests.db", poll_s=0, scores=scores)
    sentences = ["a b c d", "", "e f g"]
    with TestClient(create_app(cfg)) as client:
        r = client.post("/translate", content=json.dumps({"sentences": sentences}),
                        headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        answered = r.json()["translations"]
    with open_request_log(cfg.log_path, read_only=True) as log:
        rows = log.latest(10)
    assert [row.source for row in rows] == sentences and [row.output for row in rows] == answered
    assert rows[1].signals is None  # a blank line: nothing was translated
    for row in (rows[0], rows[2]):
        assert list(row.signals) == list(SIGNALS)
        assert (row.signals["seq_logprob"] is not None) == scores  # --no-scores: no log-probability to report
        assert row.signals["seq_logprob"] is None or row.signals["seq_logprob"] <= 0
        assert 0 <= row.signals["copy_rate"] <= 1 and row.signals["length_ratio"] >= 0
