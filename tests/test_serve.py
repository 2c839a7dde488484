"""Serving: the export bundle, the MLflow registry rules and pyfunc model, and ``aiayn serve`` on a
free loopback port (happy path, every bad input, micro-batching, the request log, alias moves)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from support import tiny  # noqa: E402
from support.scratch import copy_project  # noqa: E402
from aiayn.config.schema import params_from_dict  # noqa: E402
from aiayn.inference.artifacts import EAGER, BundleError, read_bundle_info  # noqa: E402
from aiayn.inference.load import ServingBundle  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402
from aiayn.inference.load import BundlePredictor, sentences_from_input  # noqa: E402
from aiayn.export.bundle import build_bundle  # noqa: E402
from aiayn.export.bundle import register_bundle  # noqa: E402
from aiayn.tracking import CHALLENGER, CHAMPION, choose_alias  # noqa: E402
from aiayn.tracking.registry import PYFUNC_CODE_FILE, pyfunc_code  # noqa: E402
from aiayn.serving.app import MicroBatcher, ServeConfig, ServedModel, create_app  # noqa: E402
from aiayn.inference.translator import Translator  # noqa: E402

OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.0, max_len_b=6)
CARD = tiny.CARD
#: Deadlines and client timeouts that only bound a hang: the tests wait on events and states.
HANG_S = 300


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tokenizer, a model bundle and two serving bundles of it (CTranslate2 float32 and eager)."""
    root = tmp_path_factory.mktemp("serve")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    model = Translator.from_dir(layout.model, device="cpu")
    ct2 = tiny.ct2_bundle(root, layout, tok, OPTIONS)
    eager = build_bundle(root / "bundle-eager", model_dir=layout.model, variant=EAGER, variant_dir=None,
                         compute_type=None, decode=OPTIONS, card=CARD)
    en, _ = tiny.corpus(40, 7)
    return {"root": root, "tok": tok, "layout": layout, "model": model, "ct2": ct2, "eager": eager, "en": en}


# --------------------------------------------------------------------------- pure rules


def test_alias_rule_champion_only_when_at_least_as_good():
    assert choose_alias(30.0, None) == CHAMPION  # first version
    assert choose_alias(30.1, 30.0) == CHAMPION
    assert choose_alias(30.0, 30.0) == CHAMPION  # tie: the newer version takes over
    assert choose_alias(29.9, 30.0) == CHALLENGER


def test_a_model_whose_training_was_cut_is_never_made_champion():
    """A run cut by the clock or a signal is a failure (its model is not the configured one): the registry
    gives it ``challenger`` even with no champion yet or a better BLEU, and the export stage marks it so."""
    from aiayn.config.schema import TrainConfig
    from aiayn.stages.export import registry_provenance
    from aiayn.stages.train import budget_line

    assert choose_alias(40.0, None, budget_cut="max_time_s") == CHALLENGER
    assert choose_alias(40.0, 30.0, budget_cut="signal") == CHALLENGER
    cut = {"stopped_by": "max_time_s", "budget": budget_line("max_time_s", 1576, TrainConfig(max_steps=1900))}
    assert registry_provenance(cut, "c0ffee", False) == {
        "git_commit": "c0ffee", "git_dirty": False, "train.budget_cut": "max_time_s"}
    for complete in ("max_steps", "early_stop", "max_epochs"):
        meta = {"stopped_by": complete, "budget": budget_line(complete, 1900, TrainConfig(max_steps=1900, max_epochs=9))}
        assert "train.budget_cut" not in registry_provenance(meta, "c0ffee", False)


def test_a_cut_model_registers_as_challenger_with_no_champion(world, tmp_path):
    """Through MLflow: the first version of a fresh registry, its training cut, gets ``challenger`` and the
    ``train.budget_cut`` tag; no ``champion`` alias exists, so ``aiayn serve`` does not pick it up."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _register(store, tmp_path, world["ct2"], 40.0, cut="max_time_s")
    assert out == {"version": "1", "alias": CHALLENGER, "champion_bleu_before": None}
    client = MlflowClient(tracking_uri=store)
    assert client.get_model_version("aiayn-en-de", "1").tags["train.budget_cut"] == "max_time_s"
    assert CHAMPION not in client.get_registered_model("aiayn-en-de").aliases


def test_sentences_from_every_pyfunc_input_shape():
    want = ["a man", "two dogs"]
    assert sentences_from_input(want) == want
    assert sentences_from_input(pd.Series(want)) == want
    assert sentences_from_input(pd.DataFrame({"sentence": want})) == want
    assert sentences_from_input(np.array(want)) == want
    with pytest.raises(TypeError, match="item 1 is int"):
        sentences_from_input(["a", 3])
    with pytest.raises(TypeError, match="2 columns"):
        sentences_from_input(pd.DataFrame({"a": want, "b": want}))
    with pytest.raises(TypeError, match="dict"):
        sentences_from_input({"sentences": want})
    with pytest.raises(ValueError, match="empty"):
        sentences_from_input([])


# --------------------------------------------------------------------------- bundle


@pytest.mark.parametrize("kind", ["ct2", "eager"])
def test_bundle_translates_like_the_model_it_ships(world, kind):
    bundle = BundlePredictor(world[kind])
    tr, info = bundle.translator, bundle.info
    assert info["variant"] == ("ct2-float32" if kind == "ct2" else EAGER) and info["decode"]["beam_size"] == 2
    src = world["en"][:12] + ["", "a \u2603 man"]  # blank line and an unknown character follow the shared rules
    # eager: our beam search itself; CTranslate2 float32: greedy is exact (a random model's beams run into
    # the length cap, where CTranslate2's last step differs: aiayn.inference.runtimes)
    opts = OPTIONS if kind == "eager" else DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=6)
    got = tr.translate(src, opts)
    assert got == world["model"].translate(src, opts)
    assert len(got) == len(src) and got[12] == ""
    card = json.loads((world[kind] / "model_card.json").read_text())
    assert card["variant"] == info["variant"] and "## Known limits" in (world[kind] / "model_card.md").read_text()


def test_bad_bundles_are_refused_with_a_message(world, tmp_path):
    with pytest.raises(BundleError, match="not a serving bundle"):
        read_bundle_info(tmp_path)
    (tmp_path / "bundle.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_bundle_info(tmp_path)
    (tmp_path / "bundle.json").write_text(json.dumps({"format": 1, "runtime": "ctranslate2", "variant": "x", "decode": {}}))
    with pytest.raises(BundleError, match="model.json"):
        ServingBundle.load(tmp_path)
    with pytest.raises(BundleError, match="not a CTranslate2 model folder"):
        build_bundle(tmp_path / "out", model_dir=world["layout"].model, variant="ct2-int8", variant_dir=tmp_path,
                     compute_type="int8", decode=OPTIONS, card=CARD)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- registry + pyfunc


def _register(store: str, root: Path, bundle: Path, bleu: float, cut: str | None = None) -> dict:
    from aiayn.config.schema import TrainConfig
    from aiayn.stages.export import registry_provenance
    from aiayn.stages.train import budget_line
    from aiayn.tracking import Tracker

    stopped_by, step = cut or "max_steps", 54  # the train stage's model.json: a cut run stops short of max_steps
    budget = budget_line(stopped_by, step, TrainConfig(max_steps=1900 if cut else step))
    meta = {"stopped_by": stopped_by, "budget": budget}
    with Tracker("export", project_root=root, tracking_uri=store, end_pipeline=True) as t:
        variant = read_bundle_info(bundle)["variant"]
        out = register_bundle(t, bundle, name="aiayn-en-de", variant=variant, gate_split="test_a", bleu=bleu,
                              example=["a man"], provenance=registry_provenance(meta, "c0ffee", False))
    assert out is not None, "registration failed (see the warning)"
    return out


@pytest.fixture(scope="module")
def registry(world):
    """A SQLite MLflow store with two registrations: v1 (BLEU 30, champion), v2 (29, challenger), built
    once for the module and never changed: tests that only read it share it, a test that registers
    or moves an alias takes ``own_registry``, a copy of its own."""
    root = world["root"] / "reg"
    root.mkdir()
    store = f"sqlite:///{root / 'mlflow.db'}"
    v1 = _register(store, root, world["ct2"], 30.0)
    v2 = _register(store, root, world["eager"], 29.0)
    return {"store": store, "root": root, "v1": v1, "v2": v2}


@pytest.fixture
def own_registry(registry, tmp_path) -> dict:
    """A copy of ``registry`` (its folder: the SQLite store, the artifacts, the pipeline state) in this
    test's ``tmp_path``, its absolute artifact locations pointing into the copy
    (``support.scratch.copy_project``): what a test that changes the registry works on."""
    root = copy_project(registry["root"], tmp_path / "reg")
    return {**registry, "store": f"sqlite:///{root / 'mlflow.db'}", "root": root}


def test_registry_aliases_follow_the_bleu_rule(world, registry):
    from mlflow import MlflowClient

    assert registry["v1"] == {"version": "1", "alias": CHAMPION, "champion_bleu_before": None}
    assert registry["v2"] == {"version": "2", "alias": CHALLENGER, "champion_bleu_before": 30.0}
    client = MlflowClient(tracking_uri=registry["store"])
    assert str(client.get_model_version_by_alias("aiayn-en-de", CHAMPION).version) == "1"
    assert str(client.get_model_version_by_alias("aiayn-en-de", CHALLENGER).version) == "2"
    mv = client.get_model_version("aiayn-en-de", "2")
    assert mv.tags["variant"] == EAGER and float(mv.tags["bleu.test_a"]) == 29.0 and mv.tags["git_commit"] == "c0ffee"
    # the version is an MLflow 3 logged model of the pipeline run, listed as an output of that run and of
    # the export run that logged it, with the gate BLEU on the model
    assert mv.source.startswith("models:/m-")  # what links a version to its logged model in MLflow's OSS registry
    model = client.get_logged_model(mv.source.removeprefix("models:/"))
    assert model.status == "READY" and model.name == "serving_model"
    assert [m.value for m in model.metrics if m.key == "serving.test_a.bleu"] == [29.0]
    # evaluate's headline key on the pipeline run is never overwritten by the served variant's score
    assert "test_a.bleu" not in client.get_run(mv.run_id).data.metrics
    export_run = client.get_run(model.tags["aiayn.export_run_id"])
    parent_id = export_run.data.tags["mlflow.parentRunId"]
    assert model.source_run_id == mv.run_id == parent_id  # the pipeline run: its row in the runs table shows it
    for rid in (export_run.info.run_id, parent_id):
        assert model.model_id in [o.model_id for o in client.get_run(rid).outputs.model_outputs]


def test_pyfunc_model_answers_a_list_and_a_frame_alike_and_refuses_wrong_types(world, registry):
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(registry["store"])
    try:
        m = mlflow.pyfunc.load_model("models:/aiayn-en-de@champion")
    finally:
        mlflow.set_tracking_uri(None)
    src = world["en"][:5]
    want = BundlePredictor(world["ct2"]).translator.translate(src, OPTIONS)
    assert list(m.predict(src)) == want
    assert list(m.predict(pd.DataFrame({"sentence": src}))) == want
    assert m.metadata.get_input_schema().to_dict() == [{"type": "string", "required": True}]  # sentences in
    # numbers, a mapping, None, nothing: refused (a nested list is turned into text by MLflow's own schema
    # enforcement before our code sees it; see the README)
    for wrong in ([1, 2], {"sentences": src}, [None], []):
        with pytest.raises(MlflowException) as err:
            m.predict(wrong)
        assert err.value.error_code == "INVALID_PARAMETER_VALUE"


def test_the_registered_pyfunc_is_code_not_a_pickle(world, registry):
    """MLflow warned at every export that the model was a CloudPickle ("may execute arbitrary code during
    deserialization"): the saved model is now its code file (MLflow's models from code), which names the
    predictor by import, and holds no pickle."""
    import mlflow.artifacts

    mlflow.set_tracking_uri(registry["store"])
    try:
        local = Path(mlflow.artifacts.download_artifacts("models:/aiayn-en-de@champion", dst_path=str(world["root"] / "dl")))
    finally:
        mlflow.set_tracking_uri(None)
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))], files
    code = next(f for f in files if f.endswith(PYFUNC_CODE_FILE))
    text = (local / code).read_text()
    assert f"from {BundlePredictor.__module__} import {BundlePredictor.__qualname__} as predictor" in text
    with pytest.raises(ValueError, match="cannot be imported by name"):
        pyfunc_code(type("Local", (), {"__module__": "__main__"}))


# --------------------------------------------------------------------------- micro-batcher


def test_a_request_whose_caller_gave_up_is_not_decoded(world):
    tr = BundlePredictor(world["ct2"]).translator
    model = ServedModel(tr, OPTIONS, "m", "1", "x")
    units = tr.prepare(world["en"][:4], OPTIONS).units
    decoded: list[int] = []
    started, release = threading.Event(), threading.Event()

    def decode(m, u, job):  # the first decode holds the only worker until the test releases it
        decoded.append(len(u))
        started.set()
        release.wait(60)
        return m.translator.decoder.translate_ids(u, job)

    async def main():
        b = MicroBatcher(max_batch=1, max_wait_s=0, workers=1, decode=decode)
        b.start()
        first = asyncio.ensure_future(b.submit(model, units[:1], OPTIONS))
        await asyncio.to_thread(started.wait, 60)  # decoding now: the next two wait in the queue
        gone = asyncio.ensure_future(b.submit(model, units[1:3], OPTIONS))
        kept = asyncio.ensure_future(b.submit(model, units[3:], OPTIONS))
        while b._queue.qsize() < 2:  # both queued (no worker is free to take them) -- no sleep decides this
            await asyncio.sleep(0.01)
        gone.cancel()  # its client hung up
        release.set()
        res = await asyncio.gather(first, kept)
        await b.stop()
        return res

    first, kept = asyncio.run(main())
    assert decoded == [1, 1]  # the abandoned request's two units were never decoded
    assert first + kept == tr.decoder.translate_ids(units[:1], OPTIONS) + tr.decoder.translate_ids(units[3:], OPTIONS)


def test_micro_batches_merge_requests_and_a_failure_stays_with_its_request(world):
    tr = BundlePredictor(world["ct2"]).translator
    units = tr.prepare(world["en"][:16], OPTIONS).units
    sizes: list[int] = []

    class Poisoned:  # a decoder that fails on one specific request's units only
        def __init__(self, inner):
            self.inner = inner

        def translate_ids(self, sources, options):
            if any(len(s) == 1 for s in sources):
                raise RuntimeError("poisoned unit")
            return self.inner.translate_ids(sources, options)

    bad_model = ServedModel(Translator(tr.tokenizer, Poisoned(tr.decoder)), OPTIONS, "m", "1", "x")

    async def main():
        b = MicroBatcher(max_batch=64, max_wait_s=0.05, workers=1, observe=sizes.append)
        b.start()
        good = [b.submit(bad_model, [u], OPTIONS) for u in units]
        bad = b.submit(bad_model, [np.asarray([3])], OPTIONS)  # EOS only: the poisoned request
        res = await asyncio.gather(*good, bad, return_exceptions=True)
        await b.stop()
        return res

    res = asyncio.run(main())
    assert isinstance(res[-1], RuntimeError)
    assert [r[0] for r in res[:-1]] == tr.decoder.translate_ids(units, OPTIONS)
    assert sizes[0] == 17  # all 17 requests arrived within max_wait: one merged batch (then isolated)


def test_a_lone_request_does_not_wait_for_company(world):
    """With no other request queued or decoding, a batch closes at once instead of after max_wait."""
    tr = BundlePredictor(world["ct2"]).translator
    model = ServedModel(tr, OPTIONS, "m", "1", "x")
    units = tr.prepare(world["en"][:3], OPTIONS).units

    async def main():
        b = MicroBatcher(max_batch=64, max_wait_s=120.0, workers=1)  # far above any host's decode time
        b.start()
        t0 = time.perf_counter()
        lone = await b.submit(model, units[:1], OPTIONS)
        lone_s = time.perf_counter() - t0
        # two at once: the first opens the batch, sees the second outstanding and takes it along
        pair = await asyncio.gather(b.submit(model, units[1:2], OPTIONS), b.submit(model, units[2:3], OPTIONS))
        await b.stop()
        return lone, lone_s, pair

    lone, lone_s, pair = asyncio.run(main())
    # had it waited for company it would have taken the whole max_wait: the configuration is the bound
    assert lone_s < 120.0, f"a lone request waited {lone_s:.2f} s (max_wait 120 s)"
    assert lone == tr.decoder.translate_ids(units[:1], OPTIONS) and [p[0] for p in pair] == tr.decoder.translate_ids(units[1:3], OPTIONS)


# --------------------------------------------------------------------------- the service


class Server:
    """``create_app(cfg)`` under uvicorn in a thread, on a free loopback port."""

    def __init__(self, cfg: ServeConfig) -> None:
        import uvicorn

        self.app = create_app(cfg)
        self.url = f"http://127.0.0.1:{cfg.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=cfg.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "Server":
        self.thread.start()
        deadline = time.monotonic() + HANG_S
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_S)


def _service_config(world, folder: Path) -> ServeConfig:
    return ServeConfig(bundle=world["ct2"], port=tiny.free_port(), log_path=folder / "requests.db", max_sentences=8,
                       max_body_bytes=4096, max_request_tokens=200, max_wait_ms=20, poll_s=0)


@pytest.fixture
def service(world, tmp_path):
    cfg = _service_config(world, tmp_path)
    with Server(cfg) as s:
        yield s, cfg


@pytest.fixture(scope="module")
def shared_service(world, tmp_path_factory):
    """One server for the many bad-request cases (each checks it is still serving afterwards)."""
    cfg = _service_config(world, tmp_path_factory.mktemp("shared"))
    with Server(cfg) as s:
        yield s, cfg


def test_translate_happy_path_health_metadata_metrics(world, service):
    s, cfg = service
    with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        assert c.get("/health").json() == {"status": "alive"}
        assert c.get("/ready").status_code == 200
        src = world["en"][:3] + [""]
        r = c.post("/translate", json={"sentences": src})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["translations"] == BundlePredictor(world["ct2"]).translator.translate(src, OPTIONS)
        assert body["model"] == {"name": "aiayn-test", "version": "local", "variant": "ct2-float32"}
        r1 = c.post("/translate", json={"sentences": src[:1], "beam_size": 1})
        assert r1.json()["translations"] == world["model"].translate(src[:1], DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=6))
        assert c.get("/metadata").json()["card"]["variant"] == "ct2-float32"
        m = c.get("/metrics").text
        assert 'aiayn_requests_total{status="200"} 2.0' in m and "aiayn_request_latency_seconds_bucket" in m
        assert "aiayn_batch_sentences_count" in m and "aiayn_tokens_out_total" in m
    db = sqlite3.connect(cfg.log_path)
    rows = db.execute("SELECT source FROM sentences JOIN requests USING (request_id) ORDER BY requests.ts, idx").fetchall()
    assert [r[0] for r in rows] == src + src[:1]


@pytest.mark.parametrize("kwargs, status, needle", [
    ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "not valid JSON"),
    ({"content": b"\xff\xfe", "headers": {"content-type": "application/json"}}, 400, "not UTF-8"),
    ({"json": ["a man"]}, 400, "JSON object"),
    ({"json": {"text": ["a"]}}, 422, "unknown field"),
    ({"json": {}}, 422, "missing field 'sentences'"),
    ({"json": {"sentences": "a man"}}, 422, "must be a list"),
    ({"json": {"sentences": []}}, 422, "empty"),
    ({"json": {"sentences": ["a", 3]}}, 422, "sentences[1] must be a string"),
    ({"json": {"sentences": ["a"] * 9}}, 422, "over the limit of 8"),
    ({"json": {"sentences": ["a"], "beam_size": 0}}, 422, "beam_size"),
    ({"json": {"sentences": ["a"], "beam_size": "4"}}, 422, "beam_size"),
    ({"json": {"sentences": ["a man " * 1000]}}, 413, "over the limit"),
    ({"json": {"sentences": ["dog " * 300]}}, 422, "source tokens"),
    ({"content": b'{"sentences": ["a"]}', "headers": {"content-type": "text/plain"}}, 415, "application/json"),
])  # fmt: skip
def test_bad_requests_get_4xx_naming_the_problem_and_nothing_is_logged(shared_service, kwargs, status, needle):
    s, cfg = shared_service
    count = lambda: sqlite3.connect(cfg.log_path).execute("SELECT count(*) FROM requests").fetchone()[0]  # noqa: E731
    before = count()
    with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        r = c.post("/translate", **kwargs)
        assert r.status_code == status, r.text
        assert needle in r.json()["detail"]
        assert count() == before  # the refused request left no row
        assert c.post("/translate", json={"sentences": ["a man"]}).status_code == 200  # still serving
    assert count() == before + 1


def test_no_scores_skips_the_scoring_pass_and_keeps_the_translations(world, tmp_path, monkeypatch):
    """``--no-scores``: plain answers are ``translate_ids``'s translations without a ``"scores"`` key and
    without the teacher-forced pass (``score_ids`` never called); an ``n_best`` request is still scored."""
    from dataclasses import replace

    from aiayn.inference.runtimes import CT2Decoder

    calls = []
    real = CT2Decoder.score_ids
    monkeypatch.setattr(CT2Decoder, "score_ids", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    src = world["en"][:3] + [""]
    with Server(replace(_service_config(world, tmp_path), scores=False)) as s, \
            httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        plain = c.post("/translate", json={"sentences": src}).json()
        assert not calls
        nbest = c.post("/translate", json={"sentences": src, "n_best": 2}).json()
    assert "scores" not in plain and plain["translations"] == BundlePredictor(world["ct2"]).translator.translate(src, OPTIONS)
    assert calls and len(nbest["scores"]) == 4 and nbest["translations"] == plain["translations"]


def test_n_best_with_scores_and_a_score_for_every_sentence(world, shared_service):
    s, cfg = shared_service
    src = world["en"][:3] + [""]
    tr = BundlePredictor(world["ct2"]).translator
    units = tr.prepare(src, OPTIONS).units
    want = tr.decoder.translate_hyps(units, OPTIONS, n_best=2)
    with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        plain = c.post("/translate", json={"sentences": src}).json()
        r = c.post("/translate", json={"sentences": src, "n_best": 2}).json()
        too_many = c.post("/translate", json={"sentences": src, "n_best": 3})
    assert plain["translations"] == r["translations"] == tr.translate(src, OPTIONS)  # 1-best unchanged
    assert "nbest" not in plain and len(plain["scores"]) == 4 and plain["scores"][3] == 0.0  # blank: nothing decoded
    assert plain["scores"][:3] == pytest.approx([h[0].score for h in want], abs=1e-6)
    for line, hyps, text in zip(r["nbest"], want, r["translations"]):
        assert [x["score"] for x in line] == pytest.approx([h.score for h in hyps], abs=1e-6)
        assert line[0]["translation"] == text and len(line) == 2
    assert r["nbest"][3] == [{"translation": "", "score": 0.0}]
    assert too_many.status_code == 422 and "must not exceed the beam size (2)" in too_many.json()["detail"]


def test_wrong_method_and_unknown_path_are_json_errors_and_counted(shared_service):
    s, _ = shared_service
    with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        r = c.get("/translate")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"] == "method_not_allowed" and "GET /translate" in r.json()["detail"]
        assert c.post("/nowhere", json={}).status_code == 404
        m = c.get("/metrics").text
    assert 'aiayn_requests_total{status="405"}' in m and 'aiayn_errors_total{kind="method_not_allowed"}' in m
    assert 'aiayn_errors_total{kind="not_found"}' in m


def test_an_unwritable_log_fails_the_request_with_503(service):
    s, cfg = service
    s.app.state.aiayn.log._db.execute("PRAGMA query_only=ON")  # a real SQLite write failure
    with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        r = c.post("/translate", json={"sentences": ["a man"]})
    assert r.status_code == 503 and "request log" in r.json()["detail"]


def _hold_first_decode_until_queued(state, queued: int) -> threading.Event:
    """Make the service's first decode hold the one worker until ``queued`` more requests wait behind
    it (``aiayn_requests_decoding``, read from the service's own metrics): the next batch then takes
    them together. Returns an event set once the hold has ended."""
    inner, held = state.batcher.decode, threading.Event()

    def decode(model, units, job):
        if not held.is_set():
            deadline = time.monotonic() + HANG_S  # bounds a hang only
            while state.registry.get_sample_value("aiayn_requests_decoding") < 1 + queued:
                assert time.monotonic() < deadline, "the other requests never queued"
                time.sleep(0.01)
            held.set()
        return inner(model, units, job)

    state.batcher.decode = decode
    return held


def test_concurrent_clients_one_invalid_and_every_answer_logged(world, service):
    """100 clients at once, one invalid: every valid answer right and logged once, and requests merged
    into micro-batches: the first decode holds the one worker until others queue behind it (an event,
    so the merge does not depend on how the clients' threads happen to be scheduled)."""
    s, cfg = service
    sentences = world["en"]
    want = dict(zip(sentences, BundlePredictor(world["ct2"]).translator.translate(sentences, OPTIONS)))
    held = _hold_first_decode_until_queued(s.app.state.aiayn, queued=2)

    def client(i: int):
        with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
            if i == 5:
                return c.post("/translate", json={"sentences": ["a", None]})
            batch = [sentences[(i + k) % len(sentences)] for k in range(1 + i % 4)]
            return c.post("/translate", json={"sentences": batch}), batch

    n = 100
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(client, range(n)))
    assert results[5].status_code == 422
    answered = [(r, b) for r, b in (x for i, x in enumerate(results) if i != 5)]
    assert all(r.status_code == 200 for r, _ in answered), [r.text for r, _ in answered if r.status_code != 200][:3]
    for r, batch in answered:
        assert r.json()["translations"] == [want[x] for x in batch]
    db = sqlite3.connect(cfg.log_path)
    ids = [row[0] for row in db.execute("SELECT request_id FROM requests")]
    assert len(ids) == n - 1 == len(set(ids))
    assert db.execute("SELECT count(*) FROM sentences").fetchone()[0] == sum(len(b) for _, b in answered)
    assert {r.json()["request_id"] for r, _ in answered} == set(ids)
    m = httpx.get(f"{s.url}/metrics", timeout=HANG_S).text
    batches = float(next(line.split()[-1] for line in m.splitlines() if line.startswith("aiayn_batch_sentences_count")))
    assert held.is_set() and batches < n - 1  # requests were merged into micro-batches


def _until(predicate, what: str, interval_s: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; the deadline (``HANG_S``) only bounds a hang."""
    deadline = time.monotonic() + HANG_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {HANG_S} s"
        time.sleep(interval_s)


def test_served_version_follows_the_alias(world, own_registry, tmp_path):
    registry = own_registry  # registers v3: a copy of the module's registry
    cfg = ServeConfig(model_uri="models:/aiayn-en-de@champion", tracking_uri=registry["store"], port=tiny.free_port(),
                      log_path=tmp_path / "requests.db", poll_s=0.3)
    with Server(cfg) as s, httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        assert c.post("/translate", json={"sentences": ["a man"]}).json()["model"]["version"] == "1"
        _register(registry["store"], registry["root"], world["eager"], 31.0)  # better: becomes champion (v3)
        _until(lambda: c.get("/ready").json()["model"]["version"] == "3", "the alias move picked up")
        r = c.post("/translate", json={"sentences": ["a man"]}).json()
        assert r["model"] == {"name": "aiayn-en-de", "version": "3", "variant": EAGER}
        # the registered copy's card names the commit; the bundle on disk (a DVC output) does not
        assert c.get("/metadata").json()["card"]["provenance"]["git_commit"] == "c0ffee"
        assert "git_commit" not in json.loads((world["eager"] / "model_card.json").read_text())["provenance"]
        downloads = Path(s.app.state.aiayn.tmp.name)  # the old version's download is deleted after the swap
        _until(lambda: len(list(downloads.iterdir())) == 1, f"one download left in {downloads}")
    rows = sqlite3.connect(cfg.log_path).execute("SELECT model_version FROM requests ORDER BY ts").fetchall()
    assert [r[0] for r in rows] == ["1", "3"]


def test_alias_move_under_load_drops_no_request(world, own_registry, tmp_path):
    """8 clients post without pause while a better version is registered: the swap happens under load,
    every request is answered 200 (by the old or the new version) and logged with the version that
    answered. Each step waits on what the clients were answered: every client answered before the
    registration, and after the swap 8 more answers by the new version."""
    from mlflow import MlflowClient

    registry = own_registry  # registers a version: a copy of the module's registry
    cfg = ServeConfig(model_uri="models:/aiayn-en-de@champion", tracking_uri=registry["store"], port=tiny.free_port(),
                      log_path=tmp_path / "requests.db", poll_s=0.2)
    stop = threading.Event()
    answers: list[tuple[int, str | None]] = []
    answered_clients: set[int] = set()

    def client(i: int) -> None:
        with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
            while not stop.is_set():
                r = c.post("/translate", json={"sentences": ["a man", "the dog runs"]})
                answers.append((r.status_code, r.json().get("model", {}).get("version")))
                answered_clients.add(i)

    with Server(cfg) as s, ThreadPoolExecutor(8) as pool:
        before = httpx.get(f"{s.url}/ready", timeout=HANG_S).json()["model"]["version"]
        futures = [pool.submit(client, i) for i in range(8)]
        try:
            _until(lambda: len(answered_clients) == 8 or any(f.done() for f in futures), "every client answered")
            best = max(float(mv.tags["bleu.test_a"]) for mv in MlflowClient(registry["store"]).search_model_versions("name='aiayn-en-de'"))
            new = _register(registry["store"], registry["root"], world["ct2"], best + 1.0)["version"]
            _until(lambda: sum(v == new for _, v in answers) >= 8 or any(f.done() for f in futures),
                   "8 answers by the new version")
        finally:
            stop.set()
        for f in futures:
            f.result()
    assert {code for code, _ in answers} == {200}
    versions = [v for _, v in answers]
    assert before in versions and new in versions and versions.index(new) > versions.index(before)
    rows = sqlite3.connect(cfg.log_path).execute("SELECT model_version, count(*) FROM requests GROUP BY 1").fetchall()
    assert dict(rows) == {v: versions.count(v) for v in set(versions)}


def test_unreachable_registry_stops_serve_with_a_message(tmp_path):
    from aiayn.tracking import RegistryError

    cfg = ServeConfig(tracking_uri=f"http://127.0.0.1:{tiny.free_port()}", log_path=tmp_path / "r.db", poll_s=0)
    with pytest.raises(RegistryError, match="unreachable"):
        create_app(cfg)


def test_export_stage_builds_the_bundle_and_registers_it(world, tmp_path, monkeypatch):
    from aiayn.stages import evaluate, export, quantize

    monkeypatch.setenv("AIAYN_TRACKING", "0")
    layout = tiny.project(tmp_path, world["tok"])
    params = params_from_dict({"data": {"test_splits": ["test_a", "test_b"]}, "evaluate": {"beam_size": 1, "max_len_b": 8},
                               "quantize": {"variants": ["ct2-float32", "ct2-int8"], "gate_split": "test_a",
                                            "calibration_sentences": 8, "score_check_sentences": 4,
                                            "layer_attribution": False, "throughput": False}})
    evaluate.run(params, layout)
    quantize.run(params, layout)
    out = export.run(params, layout)
    chosen = json.loads((layout.quantized / "serving.json").read_text())["variant"]  # the quantize gate's pick
    assert chosen in ("ct2-int8", "ct2-float32")
    assert out["variant"] == chosen and out["registered"] is None  # tracking off: nothing registered
    card = json.loads((layout.export / "model_card.json").read_text())
    assert card["variant"] == chosen and card["scores"]["test_a"]["bleu_signature"].startswith("nrefs:1")
    report = json.loads((layout.quantized / "report.json").read_text())
    assert card["scores"]["test_a"]["bleu"] == report["variants"][chosen]["scores"]["test_a"]["bleu"]
    assert card["provenance"]["seed"] == 1 and card["max_source_tokens"] > 0
    assert "git_commit" not in card["provenance"]  # deterministic bytes: the commit goes to the registry copy
    bundle = BundlePredictor(layout.export)
    tr, info = bundle.translator, bundle.info
    assert info["runtime"] == "ctranslate2" and info["compute_type"] == chosen.removeprefix("ct2-")
    assert len(tr.translate(["a man", ""], DecodeOptions(beam_size=1, max_len_b=8))) == 2


@pytest.mark.slow
def test_500_requests_at_concurrency_32_leave_exactly_500_log_rows(world, service):
    s, cfg = service
    sentences = world["en"]

    def client(i: int) -> str:
        with httpx.Client(base_url=s.url, timeout=HANG_S) as c:
            r = c.post("/translate", json={"sentences": [sentences[i % len(sentences)]]})
            assert r.status_code == 200, r.text
            return r.json()["request_id"]

    with ThreadPoolExecutor(32) as pool:
        ids = list(pool.map(client, range(500)))
    db = sqlite3.connect(cfg.log_path)
    rows = [r[0] for r in db.execute("SELECT request_id FROM requests")]
    assert len(rows) == 500 == len(set(rows)) and set(rows) == set(ids)
    assert db.execute("SELECT count(*) FROM sentences").fetchone()[0] == 500
