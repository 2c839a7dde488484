"""The output-quality loop end to end, on a tiny project: the service answers and logs each answer with its
output signals -> `aiayn monitor` passes the window while the shipped bundle answers and alarms once a broken
one does -> `aiayn review export` queues the flagged answers -> a translator's corrections come back with
`aiayn review import` -> the reviewed corpus is a training source `aiayn check` accepts.

The broken model is the shipped one with its decoder's last layer norm pinned to one direction: it answers
every sentence with the same word (a truncated answer), which the output reference's thresholds flag."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import yaml
from fastapi.testclient import TestClient
from support import tiny
from typer.testing import CliRunner

from aiayn.checkpoint import load_model_weights, save_model
from aiayn.cli.main import app
from aiayn.config.schema import EOS_ID, MonitorConfig
from aiayn.data.readers import TsvPairs
from aiayn.inference.runtimes import DecodeOptions
from aiayn.quality.calibration import flags
from aiayn.serving.app import create_app
from aiayn.serving.config import ServeConfig
from aiayn.serving.request_log import open_request_log
from monitoring.output_check import OUTPUT_REFERENCE, load_output_reference
from monitoring.reference import reference_dir
from monitoring.review import REVIEWED_CORPUS

CFG = MonitorConfig(embedding_dims=8, window_size=40, min_window=10, embedding_sample=100, embedding_method=None)
OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.2, max_len_b=6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("round-trip")
    world = tiny.monitored_project(root, CFG, val=200, bundle=OPTIONS)  # the output reference: the bundle's answers
    layout = world["layout"]
    (layout.root / "params.yaml").write_text(yaml.safe_dump({"monitor": CFG.model_dump(mode="json")}))
    tiny.card_languages(layout.export)  # the language the service's output-language signal expects, as shipped
    return world | {"broken": tiny.card_languages(_broken_bundle(root, layout, world["tok"]))}


def _broken_bundle(root, layout, tok):
    model = root / "broken" / "model"
    shutil.copytree(layout.model, model)
    w = load_model_weights(model / "model.safetensors")
    eos = w["tgt_embed.weight"][EOS_ID]
    w["decoder_layers.1.ffn_block.norm.weight"] = w["decoder_layers.1.ffn_block.norm.weight"] * 0
    w["decoder_layers.1.ffn_block.norm.bias"] = 10 * eos / eos.norm()
    save_model(model / "model.safetensors", w)
    return tiny.ct2_bundle(root / "broken", SimpleNamespace(model=model), tok, OPTIONS)


def _serve(world, bundle, sentences: list[str]) -> dict[str, float]:
    """Serve ``bundle`` (logging into the project's log), send ``sentences`` 4 per request; returns the
    flagged-answer counters of /metrics."""
    layout = world["layout"]
    cfg = ServeConfig(bundle=bundle, log_path=layout.root / CFG.log_path, poll_s=0,
                      output_reference=reference_dir(layout) / OUTPUT_REFERENCE)
    with TestClient(create_app(cfg)) as client:
        for i in range(0, len(sentences), 4):
            r = client.post("/translate", content=json.dumps({"sentences": sentences[i:i + 4]}),
                            headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
        text = client.get("/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("aiayn_flagged_answers_total", "aiayn_judged_answers_total"))}


def _cli(*args: str, code: int = 0):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def test_a_broken_model_s_answers_are_flagged_reviewed_and_corrected_into_a_training_corpus(world, tmp_path):
    layout, root = world["layout"], str(world["layout"].root)
    thresholds = load_output_reference(reference_dir(layout))["thresholds"]
    monitor = ("monitor", "--root", root, "--no-track", "--json")
    _serve(world, layout.export, tiny.corpus(40, 5)[0])  # the shipped bundle, in-domain input
    ok = json.loads(_cli(*monitor, "--out", str(tmp_path / "ok")).stdout)
    assert ok["outputs"]["verdict"] == "ok" and ok["outputs"]["answered"] == 40

    english = tiny.corpus(40, 6)[0]
    counters = _serve(world, world["broken"], english)  # a broken model swapped in
    with open_request_log(layout.root / CFG.log_path, read_only=True) as log:
        window = log.latest(40)
    assert [s.source for s in window] == english and len({s.output for s in window}) == 1  # one word for all
    judged = [flags(s.signals, thresholds) for s in window]
    assert counters["aiayn_judged_answers_total"] == 40  # /metrics counted them as they were answered
    for name in thresholds:
        assert counters[f'aiayn_flagged_answers_total{{signal="{name}"}}'] == sum(j[name] for j in judged)
    summary = json.loads(_cli(*monitor, "--out", str(tmp_path / "alarm"), code=1).stdout)  # exit 1: an alarm
    assert summary["outputs"]["verdict"] == "alarm" and summary["outputs"]["alarms"], summary["outputs"]
    assert (tmp_path / "alarm" / "outputs.html").is_file()

    exported = _cli("review", "export", "--root", root, "--sample", "0", "--out", str(tmp_path / "review"))
    tasks = json.loads((tmp_path / "review" / "review.json").read_text())
    flagged = {w.source for w, j in zip(window, judged) if any(j.values())}
    assert len(flagged) > 20 and {t["data"]["source"] for t in tasks} >= flagged, exported.output  # all queued

    rows = ["request_id\tidx\tverdict\tcorrection"] + [
        f"{t['data']['request_id']}\t{t['data']['idx']}\tcorrected\t{_german(t['data']['source'])}" for t in tasks]
    (tmp_path / "reviewed.tsv").write_text("\n".join(rows) + "\n")
    imported = _cli("review", "import", str(tmp_path / "reviewed.tsv"), "--root", root, "--reviewer", "anna")
    assert f"{len(tasks)} recorded" in imported.output

    corpus = layout.root / REVIEWED_CORPUS
    assert {(s, t) for _, s, t in TsvPairs(corpus, "en", "de")} >= {(s, _german(s)) for s in flagged}
    for split in ("val", "test"):
        (corpus.parent / f"{split}.tsv").write_text("a dog\tein Hund\n")
    params = tmp_path / "reviewed.yaml"
    params.write_text(yaml.safe_dump({"data": {"corpus": {"kind": "tsv", "path": str(corpus.parent)},
                                               "valid_split": "val", "test_splits": ["test"]},
                                      "quantize": {"gate_split": "test"}}))
    assert _cli("check", "--params", str(params), "--root", root).stdout.strip() == f"{params}: ok"


def _german(english: str) -> str:
    return " ".join(tiny.GERMAN[w] for w in english.split())
