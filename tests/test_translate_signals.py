"""``aiayn translate --signals``: each answer's output signals (aiayn.quality.signals) as tab-separated fields
between the score and the translation; the score and the translation are those of ``--scores``, and the
signals those the service logs for the same sentences (aiayn.cli.translate_output)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from support import tiny
from typer.testing import CliRunner

from aiayn.cli.main import app
from aiayn.cli.translate_output import SIGNAL_FIELDS
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from aiayn.quality.signals import SIGNALS, LanguageScorer, line_signals
from aiayn.serving.app import create_app
from aiayn.serving.config import ServeConfig
from aiayn.serving.request_log import open_request_log

SOURCES = ["a man runs in the park", "", "two dogs play with the ball", "the red cat jumps"]
DATA = "".join(f"{s}\n" for s in SOURCES).encode()
OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.2, max_len_b=6)
FIELDS = 1 + len(SIGNALS) + 1  # score, the signals, the translation


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("translate-signals")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    bundle = tiny.card_languages(tiny.ct2_bundle(root, layout, tok, OPTIONS))  # the service's target language
    return {"model": layout.model, "bundle": bundle}


def _translate(*args: str, data: bytes = DATA):
    r = CliRunner().invoke(app, ["translate", *args], input=data)
    assert r.exit_code == 0, r.output
    return [line.split("\t") for line in r.stdout.splitlines()]


def _value(field: str) -> float | None:
    return None if field == "" else float(field)


def test_signal_fields_sit_between_the_score_and_the_translation(world):
    model = ["--model-dir", str(world["model"]), "--beam-size", "2", "--max-len-b", "6"]
    signed, scored = _translate(*model, "--signals"), _translate(*model, "--scores")
    assert list(SIGNAL_FIELDS) == list(SIGNALS) and len(signed) == len(SOURCES)
    assert all(len(row) == FIELDS for row in signed)
    assert [(row[0], row[-1]) for row in signed] == [tuple(row) for row in scored]  # --scores' fields, unchanged
    assert signed[1][1:-1] == [""] * len(SIGNALS)  # a blank line: nothing answered, no signal
    # the signals as the translation path computes them: the same hypotheses, line_signals over them
    tr = Translator.from_dir(world["model"], device="cpu")
    options = DecodeOptions(beam_size=2, max_len_b=6)
    prepared = tr.prepare(SOURCES, options, long="split")
    hyps = tr.decoder.translate_hyps(prepared.units, options, n_best=1)
    texts = [row[-1] for row in signed]
    want = line_signals(prepared.spans, prepared.units, hyps, texts, scored=True, target_lang="de",
                        language=LanguageScorer())
    for row, expected in zip(signed, want):
        if expected is None:
            continue
        got = dict(zip(SIGNALS, map(_value, row[1:-1])))
        assert got["repeat_ngram"] == expected["repeat_ngram"] and row[1 + SIGNALS.index("repeat_ngram")].isdigit()
        assert got == pytest.approx(expected, abs=1e-6)


def test_every_ranked_answer_gets_its_own_signals(world):
    model = ["--model-dir", str(world["model"]), "--beam-size", "2", "--max-len-b", "6"]
    ranked = _translate(*model, "--nbest", "2", "--signals")
    plain = _translate(*model, "--nbest", "2", "--scores")
    assert [(r[0], r[1], r[-1]) for r in ranked] == [tuple(r) for r in plain]
    assert all(len(r) == 1 + FIELDS for r in ranked)
    best = {row[0]: row for row in reversed(ranked)}  # the first row of each line: its rank 0
    one = _translate(*model, "--signals")
    assert [best[str(k)][1:] for k in range(len(SOURCES))] == one  # rank 0 = the 1-best answer's signals
    line0 = [r for r in ranked if r[0] == "0"]
    assert len(line0) == 2 and line0[0][-1] != line0[1][-1] and line0[0][2:-1] != line0[1][2:-1]


def test_a_bundle_s_signals_are_the_ones_the_service_logs(world, tmp_path):
    signed = _translate("--bundle", str(world["bundle"]), "--signals")
    cfg = ServeConfig(bundle=world["bundle"], log_path=tmp_path / "requests.db", poll_s=0)
    with TestClient(create_app(cfg)) as client:
        r = client.post("/translate", content=json.dumps({"sentences": SOURCES}),
                        headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    with open_request_log(cfg.log_path, read_only=True) as log:
        logged = log.latest(10)
    assert [row[-1] for row in signed] == [s.output for s in logged]
    for row, s in zip(signed, logged):
        got = None if row[1:-1] == [""] * len(SIGNALS) else dict(zip(SIGNALS, map(_value, row[1:-1])))
        assert got == (None if s.signals is None else pytest.approx(s.signals, abs=1e-6))
    assert logged[0].signals["target_language_prob"] is not None  # the language signal was compared too


def test_interactive_sessions_print_the_same_fields(world):
    model = ["--model-dir", str(world["model"]), "--beam-size", "2", "--max-len-b", "6", "--signals"]
    batch, interactive = _translate(*model), _translate(*model, "--interactive")
    assert [r[-1] for r in interactive] == [r[-1] for r in batch]
    for a, b in zip(interactive, batch):  # one line per batch vs. all at once: equal up to float summation
        assert [_value(x) for x in a[:-1]] == pytest.approx([_value(x) for x in b[:-1]], abs=1e-5)
