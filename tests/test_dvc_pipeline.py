"""The real ``dvc repro`` of the whole pipeline on the smoke configuration, in a scratch copy of the project.

The project is the session's ``smoke_pipeline`` (tests/conftest.py: fetch from the mirror ->
data.dvc -> prepare -> tokenize -> train -> evaluate -> quantize -> export -> monitor_reference,
each stage through its Prefect flow, built once for this module and ``test_pipelines``); then
checks on what it left: metrics per test set, a reproducible train output hash in dvc.lock, a
no-op repro, the MLflow record, ``aiayn translate`` on the trained bundle, the drift detector on
its reference and a ``dvc exp run --temp`` variant.

Tests that only read the project share it (``project``); a test that changes it (a forced rerun,
a repro, an edit, bytecode written into its sources, a commit, an experiment) works on a copy of
its own (``own_project``, ``support.scratch.copy_project``), so every test sees the project as the
pipeline built it, in any order.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.dag import STAGES

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
#: Subprocess timeouts only bound a hang (a loaded 2-core host ran the whole smoke pipeline in 11 min);
#: under the tests' own pytest-timeout (tests/conftest.py: PIPELINE_TIMEOUT_S), so a hung command is named.
HANG_S = 1800

pytestmark = pytest.mark.slow  # a whole pipeline: fetch -> dvc repro of every stage


def sh(*cmd: str, cwd: Path, env: dict, timeout: int = HANG_S) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def project(smoke_pipeline):
    """The session's smoke pipeline, shared: for tests that only read it."""
    return smoke_pipeline


@pytest.fixture
def own_project(smoke_pipeline, tmp_path) -> dict:
    """A copy of the smoke pipeline's project in this test's ``tmp_path`` (its DVC remote, MLflow store
    and artifact locations pointing into the copy): for a test that changes the project."""
    from support.scratch import copy_project

    return {**smoke_pipeline, "root": copy_project(smoke_pipeline["root"], tmp_path / "project")}


def _mlflow_runs(root: Path) -> set[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    return {r.info.run_id for exp in client.search_experiments() for r in client.search_runs([exp.experiment_id])}


def _stamps(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` and its modification time (ns): a stage that runs rewrites its outputs."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def untrained_scores(root: Path, split: str) -> dict:
    """BLEU/chrF of the trained bundle's architecture with fresh random weights, decoded with the
    project's evaluate settings on the prepared ``split`` (the score a pipeline that learned nothing gets)."""
    import torch

    from aiayn.config.schema import load_params
    from aiayn.data.readers import read_lines
    from aiayn.model import Transformer
    from aiayn.evaluation.scoring import score
    from aiayn.inference.runtimes import DecodeOptions, EagerDecoder
    from aiayn.inference.translator import Translator

    params = load_params(root / "params.yaml")
    trained = Translator.from_dir(root / "artifacts" / "model", device="cpu")
    torch.manual_seed(12345)
    blank = Translator(trained.tokenizer, EagerDecoder(Transformer(trained.decoder.model.cfg).eval()))
    e = params.evaluate
    src = read_lines(root / "artifacts" / "prepared" / f"{split}.{params.data.src_lang}")
    ref = read_lines(root / "artifacts" / "prepared" / f"{split}.{params.data.tgt_lang}")
    hyps = blank.translate(src, DecodeOptions(beam_size=e.beam_size, len_penalty=e.len_penalty,
                                              max_len_a=e.max_len_a, max_len_b=e.max_len_b))
    return {k: float(v) for k, v in score(hyps, ref).items() if k in ("bleu", "chrf")}


def lock_out_md5(root: Path, stage: str, path: str) -> str:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return next(o["md5"] for o in lock["stages"][stage]["outs"] if o["path"] == path)


def test_committed_data_dvc_matches_the_fetched_corpus(project):
    """data.dvc in the repo is the hash of exactly what `aiayn fetch` produces: the scratch project
    holds the committed data.dvc, the pipeline fetched the corpus, and DVC finds the two equal."""
    root, env = project["root"], project["env"]
    assert (root / "data.dvc").read_text() == (REPO / "data.dvc").read_text()
    assert project["result"]["data"] == {"data.dvc": "cached"}  # the fetched files hash as data.dvc says
    status = json.loads(sh(str(BIN / "dvc"), "status", "--json", "data.dvc", cwd=root, env=env).stdout or "{}")
    assert status == {}


def test_repro_runs_every_stage_and_metrics_show_bleu_per_test_set(project):
    root, env = project["root"], project["env"]
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    assert set(lock["stages"]) == set(STAGES)
    shown = json.loads(sh(str(BIN / "dvc"), "metrics", "show", "--json", cwd=root, env=env).stdout)
    metrics = shown[""]["data"]["artifacts/eval_metrics.json"]["data"]
    for split in TEST_SETS:
        assert 0.0 <= metrics[split]["bleu"] <= 100.0
    # a floor an untrained model cannot reach: the same architecture, untrained, decoded the same way
    untrained = untrained_scores(root, "test_2016_flickr")
    assert metrics["test_2016_flickr"]["chrf"] >= untrained["chrf"] + 3.0, (metrics["test_2016_flickr"], untrained)
    text = sh(str(BIN / "dvc"), "metrics", "show", cwd=root, env=env).stdout
    for split in TEST_SETS:
        assert f"{split}.bleu" in text
    scores = json.loads((root / "artifacts/eval/scores.json").read_text())
    assert scores["test_2016_flickr"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    hyps = (root / "artifacts/eval/test_2016_flickr.hyp.de").read_text().splitlines()
    assert len(hyps) == 40  # configs/smoke.yaml: max_eval_pairs


def test_noop_repro_runs_no_stage_and_changes_nothing(own_project):
    """A repro with nothing changed does no work: no stage runs (DVC says so, no stage records an
    MLflow run, no output is rewritten) and dvc.lock stays as it was. What it did, not how long it
    took (a timing against ``dvc status`` depended on the neighbours' load)."""
    root, env = own_project["root"], own_project["env"]
    before, runs, stamps = (root / "dvc.lock").read_text(), _mlflow_runs(root), _stamps(root / "artifacts")
    out = sh(str(BIN / "dvc"), "repro", cwd=root, env=env).stdout
    assert "up to date" in out.lower() and "running stage" not in out.lower(), out
    assert (root / "dvc.lock").read_text() == before
    assert _mlflow_runs(root) == runs  # no stage ran (each records a run)
    assert _stamps(root / "artifacts") == stamps  # no output rewritten


def test_train_stage_twice_gives_the_same_output_hash(own_project):
    root, env = own_project["root"], own_project["env"]
    first = lock_out_md5(root, "train", "artifacts/model")
    shutil.rmtree(root / "artifacts" / "checkpoints")  # no resume: retrain from scratch
    sh(str(BIN / "dvc"), "repro", "-f", "-s", "train", cwd=root, env=env)
    assert lock_out_md5(root, "train", "artifacts/model") == first


def test_stages_after_train_rerun_to_identical_lock_hashes(own_project):
    """Every output and metrics file of the stages after train is deterministic bytes: wall-clock
    numbers (decode seconds, throughput) stay out of dvc.lock, yet ``dvc metrics show`` lists them."""
    root, env = own_project["root"], own_project["env"]

    def outs() -> dict:
        lock = yaml.safe_load((root / "dvc.lock").read_text())
        return {(st, o["path"]): o["md5"] for st in ("evaluate", "quantize", "export", "monitor_reference")
                for o in lock["stages"][st]["outs"]}

    first = outs()
    assert ("quantize", "artifacts/quantize_metrics.json") in first and ("evaluate", "artifacts/eval") in first
    sh(str(BIN / "dvc"), "repro", "-f", "-s", "evaluate", cwd=root, env=env)
    sh(str(BIN / "dvc"), "repro", "-f", "-s", "quantize", cwd=root, env=env)
    sh(str(BIN / "dvc"), "repro", "-f", "-s", "export", cwd=root, env=env)
    sh(str(BIN / "dvc"), "repro", "-f", "-s", "monitor_reference", cwd=root, env=env)
    assert outs() == first
    shown = json.loads(sh(str(BIN / "dvc"), "metrics", "show", "--json", cwd=root, env=env).stdout)
    wall = shown[""]["data"]["artifacts/quantize_throughput.json"]["data"]
    assert wall["stage_seconds"] > 0 and wall["throughput"]["ct2-int8"]["b32_t1"]["sentences_per_s"] > 0


def test_mlflow_recorded_the_pipeline_run(project):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project['root'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("aiayn")
    runs = client.search_runs([exp.experiment_id])
    # the first repro's stages share one pipeline run (later forced reruns start their own)
    eval_run = min((r for r in runs if r.info.run_name == "evaluate"), key=lambda r: r.info.start_time)
    parent = eval_run.data.tags["mlflow.parentRunId"]
    stages = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent}
    assert {"train", "evaluate"} <= set(stages)
    train_run = stages["train"]
    assert train_run.data.params["train.seed"] == "1" and train_run.data.params["train.data_seed"] == "1"
    history = client.get_metric_history(train_run.info.run_id, "loss")
    smoke = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())["train"]
    assert [m.step for m in history] == list(range(smoke["log_every"], smoke["max_steps"] + 1, smoke["log_every"]))
    assert "test_2016_flickr.bleu" in eval_run.data.metrics
    # a stage run names what it read and wrote (the lock held neither when it started), no later stage's output
    tags = train_run.data.tags
    assert tags["data_hash.artifacts/model"] == lock_out_md5(project["root"], "train", "artifacts/model")
    assert tags["data_hash.artifacts/tokenized"] == lock_out_md5(project["root"], "tokenize", "artifacts/tokenized")
    assert "data_hash.artifacts/eval" not in tags and "data_hash.artifacts/export" not in tags
    # the export stage registered the bundle, as champion (the store's first version of it)
    champion = client.get_model_version_by_alias("aiayn-en-de", "champion")
    bundle = json.loads((project["root"] / "artifacts/export/bundle.json").read_text())
    assert champion.tags["variant"] == bundle["variant"] and "bleu.test_2016_flickr" in champion.tags


def test_translate_cli_on_the_trained_bundle(project):
    root, env = project["root"], project["env"]
    proc = subprocess.run([str(BIN / "aiayn"), "translate", "--model-dir", "artifacts/model", "--beam-size", "2"],
                          input="A man is riding a bike.\nTwo dogs play in the snow.\n", cwd=root, env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("▁" not in line for line in lines)
    from aiayn.config.schema import load_params

    d = load_params(root / "params.yaml").data  # no flags, in the project: the evaluate stage's output, line for line
    split = d.test_splits[0]
    same = subprocess.run([str(BIN / "aiayn"), "translate", f"artifacts/prepared/{split}.{d.src_lang}"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=HANG_S)
    assert same.returncode == 0, same.stderr
    assert same.stdout == (root / "artifacts" / "eval" / f"{split}.hyp.{d.tgt_lang}").read_text(encoding="utf-8")
    bad = subprocess.run([str(BIN / "aiayn"), "translate", "--model-dir", "nowhere"], input="x\n", cwd=root, env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert bad.returncode == 2 and "not found" in bad.stderr


def _stale_stages(root: Path, env: dict) -> set[str]:
    status = json.loads(sh(str(BIN / "dvc"), "status", "--json", cwd=root, env=env).stdout or "{}")
    return {name for name in status if not name.endswith(".dvc")}


def test_bytecode_caches_leave_dvc_status_clean(own_project):
    """Importing the package with bytecode writing on (what any normal Python use does) changes nothing."""
    root, env = own_project["root"], own_project["env"]
    bytecode_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(root / "src")}
    sh(sys.executable, "-c", "import aiayn.stages.train, aiayn.stages.evaluate, aiayn.cli.main", cwd=root, env=bytecode_env)
    sh(sys.executable, "-m", "compileall", "-q", "src", cwd=root, env=bytecode_env)
    assert list((root / "src" / "aiayn" / "model").glob("__pycache__/*.pyc")), "no bytecode was written"
    assert _stale_stages(root, env) == set()


@pytest.mark.parametrize(("path", "old", "new", "stale", "fresh"), [
    # editing the tiny preset (the main job's model) makes train stale
    ("src/aiayn/config/schema.py", 'd_ff=512, n_layers=3', 'd_ff=768, n_layers=3', {"train", "evaluate"}, set()),
    # editing the evaluate stage makes evaluate stale, and leaves training alone
    ("src/aiayn/stages/evaluate.py", "import logging", "import logging  # edited", {"evaluate"},
     {"prepare", "tokenize", "train"}),
    # decoding is a dep of train too, since training decodes the validation split (train.valid_bleu, early
    # stopping and checkpoint choice on it), and of evaluate; never of the data stages
    ("src/aiayn/inference/search.py", "import torch", "import torch  # edited", {"train", "evaluate"}, {"prepare", "tokenize"}),
])
def test_a_code_edit_makes_exactly_its_stages_stale(own_project, path, old, new, stale, fresh):
    root, env = own_project["root"], own_project["env"]
    target = root / path
    original = target.read_text(encoding="utf-8")
    assert old in original
    try:
        target.write_text(original.replace(old, new, 1), encoding="utf-8")
        found = _stale_stages(root, env)
    finally:
        target.write_text(original, encoding="utf-8")
    assert stale <= found and not (fresh & found), found
    assert _stale_stages(root, env) == set()


def test_drift_detector_on_real_shifts_with_the_pipeline_reference(project, multi30k_mirror):
    """The drift detector's known failure kinds on real Multi30k, with the smoke pipeline's model and reference
    (2,000 training sentences): same-domain Flickr windows and small training resamples are not
    flagged, German/French and noisy English always are. The full-model numbers are in the README."""
    from aiayn.config.schema import load_params
    from aiayn.stages import Layout
    from aiayn.inference.translator import Translator
    from monitoring.drift import check, load_reference
    from monitoring.reference import reference_dir
    from support.drift_inputs import insert_noise, read_split, upper, windows

    root = project["root"]
    cfg = load_params(root / "params.yaml").monitor
    ref = load_reference(reference_dir(Layout(root)))
    translator = Translator.from_dir(root / "artifacts" / "model", device="cpu")

    def flagged(ws: list[list[str]]) -> list[str]:
        return [check(w, ref, cfg, translator).summary["verdict"] for w in ws]

    t16 = read_split(multi30k_mirror, "test_2016_flickr", "en")
    t17 = read_split(multi30k_mirror, "test_2017_flickr", "en")
    same = flagged(windows(t16, 200, 10, seed=11) + windows(t17, 200, 10, seed=12))
    assert same.count("drift") <= 1, same
    small = flagged(windows(read_split(multi30k_mirror, "train", "en"), 30, 20, seed=6))
    assert small.count("drift") <= 2, small
    assert flagged(windows(t16, 20, 1, seed=0)) == ["insufficient_data"]  # below min_window: never a verdict
    shifted = (windows(read_split(multi30k_mirror, "test_2016_flickr", "de"), 200, 3, seed=14)
               + windows(read_split(multi30k_mirror, "test_2017_flickr", "fr"), 200, 2, seed=15)
               + [upper(w) for w in windows(t16, 200, 2, seed=16)]
               + [insert_noise(w, 0.3, seed=i) for i, w in enumerate(windows(t16, 200, 2, seed=17))])
    assert flagged(shifted) == ["drift"] * len(shifted)


@pytest.mark.heavy
def test_temp_experiment_with_alibi_positions_tracks_into_the_projects_store(own_project):
    """`dvc exp run --temp` runs the stages in a copy under .dvc/tmp/exps and deletes it: its MLflow runs
    must land in the project's store. The variant is a model DVC must retrain: ALiBi positions,
    which the CTranslate2 converter does not map (rotary ones it does), so
    quantize records its variants as skipped and export falls back to the eager model, instead of the
    stage failing."""
    from mlflow.tracking import MlflowClient

    root, env = own_project["root"], own_project["env"]
    sh("git", "add", "-A", cwd=root, env=env)  # an experiment needs a baseline commit
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "baseline", cwd=root, env=env)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("aiayn").experiment_id
    before = {r.info.run_id for r in client.search_runs([exp_id])}
    sh(str(BIN / "dvc"), "exp", "run", "--temp", "-S", "model.positions=alibi", cwd=root, env=env)
    assert not list((root / ".dvc" / "tmp" / "exps").glob("tmp*"))  # the copy is gone ...
    new = [r for r in client.search_runs([exp_id]) if r.info.run_id not in before]  # ... its runs are here
    by_stage = {r.info.run_name: r for r in new}
    assert {"train", "evaluate", "quantize", "export"} <= set(by_stage), sorted(by_stage)
    assert by_stage["train"].data.params["model.positions"] == "alibi"
    quantize = by_stage["quantize"].data.tags
    assert quantize["quantize.ct2-int8.status"] == "skipped" and by_stage["export"].data.tags["export.variant"] == "eager-float32"
