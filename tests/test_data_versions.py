"""What ``data.dvc`` versions and what the pipeline reports of it: Multi30k's folder only, a corpus of one's
own (under ``data/`` or elsewhere) outside it, the cache step that never commits data that differs, and the
report after a ``dvc repro`` that re-versioned a data source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_cache_data_commits_only_data_that_matches_its_dvc_file(tmp_path, prefect_harness, monkeypatch):
    """A ``.dvc`` file whose data the cache lacks (a fresh clone) and whose output folder holds other data
    (here a ``data.dvc`` versioning all of ``data/``, which holds a corpus of the user's own) must give a
    warning, not a crash, and stay as it was. DVC's status says only "not in cache" there whatever the
    workspace holds: taking that for "same hash" makes ``repo.commit`` raise ``StageCommitError``, failing
    ``make run`` before any stage."""
    from dvc.repo import Repo
    from prefect import flow

    from pipelines.pipeline import dvc_cache_data

    root = tmp_path / "project"
    (root / "data" / "multi30k").mkdir(parents=True)
    (root / "data" / "multi30k" / "train.en").write_text("a man rides a bike\n")
    monkeypatch.chdir(root)  # DVC resolves the added path against the working directory
    with Repo.init(str(root), no_scm=True) as repo:
        repo.add("data")
    recorded = (root / "data.dvc").read_text()

    @flow
    def cache_flow() -> dict:
        return dvc_cache_data(str(root))

    def empty_cache() -> None:
        shutil.rmtree(root / ".dvc" / "cache")

    empty_cache()  # the recorded data, as a fresh clone has it: versioned, never cached here
    assert cache_flow() == {"data.dvc": "cached"}
    assert any((root / ".dvc" / "cache").rglob("*")) and (root / "data.dvc").read_text() == recorded

    empty_cache()  # another corpus under data/, the recorded one absent
    shutil.rmtree(root / "data" / "multi30k")
    (root / "data" / "mine").mkdir()
    (root / "data" / "mine" / "train.en").write_text("my own corpus\n")
    result = cache_flow()["data.dvc"]
    assert result.startswith("differs from its .dvc file"), result
    assert (root / "data.dvc").read_text() == recorded


def test_a_corpus_of_ones_own_under_data_is_outside_the_multi30k_version(tmp_path, monkeypatch):
    """``data.dvc`` versions Multi30k (``data/multi30k``), not all of ``data/``: with ``data/`` as its output,
    ``dvc repro`` of a project reading ``data/mine`` re-versioned ``data.dvc`` to the user's text (DVC re-adds a
    changed data source), a side effect of every scheduled run that the report called "not committed"."""
    from dvc.repo import Repo

    root = tmp_path / "project"
    (root / "data" / "mine").mkdir(parents=True)
    (root / "data" / "mine" / "train.en").write_text("my own corpus\n")
    shutil.copy(REPO / "data.dvc", root / "data.dvc")
    (root / "dvc.yaml").write_text("stages:\n  corpus:\n    cmd: cp data/mine/train.en copy.txt\n"
                                   "    deps: [data/mine]\n    outs: [copy.txt]\n")
    monkeypatch.chdir(root)
    with Repo.init(str(root), no_scm=True) as repo:
        ran = [stage.addressing for stage in repo.reproduce()]
    assert ran == ["corpus"] and (root / "copy.txt").read_text() == "my own corpus\n"
    assert (root / "data.dvc").read_text() == (REPO / "data.dvc").read_text()


def test_the_report_says_when_dvc_repro_re_versioned_a_data_source():
    """DVC re-adds a data source whose data changed (``aiayn fetch --tok-references`` adds files to
    ``data/multi30k``): the status read before the repro ("differs") must not reach the report as the last word."""
    from pipelines.pipeline import re_versioned

    before = {"data.dvc": "differs from its .dvc file: [...]", "other.dvc": "up to date"}
    after = re_versioned(before, ["data.dvc", "corpus", "prepare"])
    assert after["data.dvc"].startswith("re-versioned by dvc repro") and "git diff data.dvc" in after["data.dvc"]
    assert after["other.dvc"] == "up to date" and re_versioned(before, ["corpus"]) == before


def test_a_corpus_anywhere_is_named_by_the_hash_dvc_recorded(tmp_path, monkeypatch):
    """One rule names the corpus a run read, ``aiayn.provenance.corpus_input`` (the ``corpus`` stage's data
    dependency in ``dvc.lock``), for MLflow's ``data.version``, the model card and the pipeline report. DVC
    records a corpus outside the project by its absolute path and hash, which the old rules dropped:
    ``data.version`` fell back to ``data.dvc``'s Multi30k (README: "your files may live anywhere"), the card
    listed no corpus and the report listed Multi30k. An absolute path inside the project DVC records relative;
    a relative one outside it (``../srv/mine``) DVC keeps as written, and it is named by its absolute path
    (it was named by the stage's snapshot, ``artifacts/corpus``, not by the path the user gave)."""
    from dvc.repo import Repo

    from aiayn.config.schema import load_params
    from aiayn.provenance import corpus_input
    from aiayn.stages import Layout
    from aiayn.stages.export import _data_hashes
    from aiayn.tracking.lineage import lineage_tags
    from pipelines.pipeline import render_report

    root, elsewhere = tmp_path / "project", tmp_path / "srv" / "mine"
    for folder in (root / "corpora" / "mine", elsewhere):
        folder.mkdir(parents=True)
        (folder / "train.en").write_text(f"the corpus in {folder.parent.name}\n")
    shutil.copy(REPO / "data.dvc", root / "data.dvc")
    multi30k_md5 = yaml.safe_load((REPO / "data.dvc").read_text())["outs"][0]["md5"]
    monkeypatch.chdir(root)
    for corpus, recorded in ((elsewhere, elsewhere.as_posix()), (root / "corpora" / "mine", "corpora/mine"),
                             ("../srv/mine", elsewhere.as_posix())):
        (root / "dvc.yaml").write_text(f"stages:\n  corpus:\n    cmd: cp {corpus}/train.en copy.txt\n"
                                       f"    deps: [{corpus}, src/aiayn/stages/corpus.py]\n    outs: [copy.txt]\n")
        (root / "src" / "aiayn" / "stages").mkdir(parents=True, exist_ok=True)
        (root / "src" / "aiayn" / "stages" / "corpus.py").write_text("# code, not data\n")
        with Repo.init(str(root), no_scm=True, force=True) as repo:
            repo.reproduce()
        (dep,) = [d for d in yaml.safe_load((root / "dvc.lock").read_text())["stages"]["corpus"]["deps"]
                  if not d["path"].endswith(".py")]
        assert corpus_input(root) == (recorded, dep["md5"]) and dep["md5"] != multi30k_md5
        assert lineage_tags(root)["data.version"] == dep["md5"]
        assert _data_hashes(Layout(root), load_params(REPO / "params.yaml")) == {recorded: dep["md5"]}
        report = render_report(metrics=None, scores=None, data_hashes={"data/multi30k": multi30k_md5},
                               mlflow_link=None, ran=[], push=None, corpus=corpus_input(root))
        assert f"- data `{recorded}` (the corpus this run read): md5 `{dep['md5']}`" in report
        assert multi30k_md5 not in report


def test_the_run_around_dvc_repro_is_tagged_with_the_corpus_the_stages_read(tmp_path, monkeypatch):
    """The pipeline flow's ``orchestrate`` run wraps ``dvc repro`` and reads its lineage when it starts, from
    the ``dvc.lock`` of the run before: a fresh clone's first run on a corpus of one's own (outside the project)
    would keep the main job's Multi30k as ``data.version`` there. ``Tracker.refresh_lineage`` re-tags it, and
    the parent, from the ``dvc.lock`` the stages wrote."""
    from mlflow import MlflowClient

    from aiayn.tracking import Tracker

    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    lock = ("schema: '2.0'\nstages:\n  corpus:\n    cmd: x\n    deps:\n    - path: {}\n      hash: md5\n"
            "      md5: {}\n    outs:\n    - path: artifacts/corpus\n      hash: md5\n      md5: {}\n")
    root, uri = tmp_path / "project", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    root.mkdir()
    (root / "dvc.lock").write_text(lock.format("data/multi30k", "1111aaaa.dir", "2222bbbb.dir"))
    with Tracker("orchestrate", project_root=root, tracking_uri=uri, end_pipeline=True) as tracker:
        (root / "dvc.lock").write_text(lock.format("/srv/corpora/mine", "7777eeee.dir", "8888ffff.dir"))
        tracker.refresh_lineage()
        run_id, parent_id = tracker.run_id, tracker.parent_run_id
    client = MlflowClient(tracking_uri=uri)
    for rid in (run_id, parent_id):
        tags = client.get_run(rid).data.tags
        assert tags["data.version"] == "7777eeee.dir" and tags["data_hash.artifacts/corpus"] == "8888ffff.dir"
    hashes = Path(client.download_artifacts(parent_id, "lineage/dvc_hashes.json", str(tmp_path)))
    assert "8888ffff.dir" in hashes.read_text() and "2222bbbb.dir" not in hashes.read_text()


def test_a_hub_dataset_is_named_by_the_snapshot_the_corpus_stage_made(tmp_path):
    """A Hugging Face hub dataset has no local data for DVC to hash (the corpus stage watches its loader,
    ``src/aiayn/data/hub.py``): its version is the stage's snapshot, ``artifacts/corpus``, where the old rule
    fell back to ``data.dvc``'s Multi30k for a run on, say, wmt/wmt14."""
    from aiayn.provenance import corpus_input
    from aiayn.tracking.lineage import lineage_tags

    shutil.copy(REPO / "data.dvc", tmp_path / "data.dvc")
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  corpus:\n    cmd: python -m pipelines.run_stage corpus\n    deps:\n"
        "    - path: src/aiayn/data/hub.py\n      hash: md5\n      md5: 8888bbbb\n"
        "    outs:\n    - path: artifacts/corpus\n      hash: md5\n      md5: 9999cccc.dir\n")
    assert corpus_input(tmp_path) == ("artifacts/corpus", "9999cccc.dir")
    assert lineage_tags(tmp_path)["data.version"] == "9999cccc.dir"


def test_dvc_hash_is_what_dvc_repro_records(tmp_path, monkeypatch):
    """``aiayn.provenance.dvc_hash`` (a file's MD5, a folder's ``.dir`` manifest hash) equals the hashes a real
    ``dvc repro`` writes into ``dvc.lock``, for a nested folder, a file and a dependency outside the project; and
    ``stage_paths`` reads the stage's data paths, its ``${...}`` template filled from ``params.yaml``."""
    from dvc.repo import Repo

    from aiayn.provenance import dvc_hash, stage_paths

    root, outside = tmp_path / "project", tmp_path / "mine"
    (outside / "sub").mkdir(parents=True)
    (outside / "train.en").write_text("a dog runs\n")
    (outside / "sub" / "b.de").write_bytes("ein Hund läuft\r\n".encode())
    root.mkdir()
    (root / "params.yaml").write_text(f"data:\n  corpus:\n    path: {outside}\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  copy:\n    cmd: mkdir -p out/deep && cp -r ${data.corpus.path}/* out/deep/ && cp"
        " ${data.corpus.path}/train.en one.txt && echo x > out/z.txt\n"
        "    deps:\n    - ${data.corpus.path}\n    - src/code.py\n    outs: [out]\n    metrics:\n    - one.txt:\n"
        "        cache: false\n")
    (root / "src").mkdir()
    (root / "src" / "code.py").write_text("x = 1\n")
    monkeypatch.chdir(root)
    with Repo.init(str(root), no_scm=True, force=True) as repo:
        repo.reproduce()
    lock = {e["path"]: e["md5"] for key in ("deps", "outs")
            for e in yaml.safe_load((root / "dvc.lock").read_text())["stages"]["copy"][key]}
    assert stage_paths(root, "copy") == ((outside.as_posix(),), ("out", "one.txt"))
    assert stage_paths(root, "nope") is None
    assert stage_paths(root, "copy", {"data": {"corpus": {"path": "/srv/else"}}}).deps == ("/srv/else",)  # its config
    assert stage_paths(root, "copy", {"data": {}}).deps == ()  # a template its config does not fill: left out
    for path in (outside.as_posix(), "out", "one.txt"):
        assert dvc_hash(root / path) == lock[path], path
    assert lock["out"].endswith(".dir") and dvc_hash(root / "absent") is None


def test_a_stage_run_is_tagged_with_what_it_read_and_wrote_not_the_run_befores(tmp_path, monkeypatch):
    """``dvc.lock`` holds a stage's own entry, and every later stage's, from the run before until DVC rewrites it
    after the stage: a stage run that read its tags from the lock when it started named the previous model as
    its own output (``train`` run, ``data_hash.artifacts/model``), and every later stage's old outputs. Now a
    stage run names what it read (hashed when it starts) and what it wrote (when it ends), the pipeline run gets
    those and none of the lock's, and ``data.version`` is the corpus the stage's config names, hashed now. The lock
    here stands for both cases where it is stale: the stage's own entry under ``dvc repro``, and every entry after
    ``aiayn <stage>`` runs outside DVC (``--params FILE``: the run of ``corpora/theirs`` below)."""
    from mlflow import MlflowClient

    from aiayn.provenance import dvc_hash
    from aiayn.tracking import Tracker

    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    root, uri = tmp_path / "project", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    for rel in ("corpora/mine/train.en", "artifacts/corpus/train.en", "artifacts/prepared/train.en"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"old {rel}\n")
    (root / "params.yaml").write_text("data:\n  corpus:\n    path: corpora/mine\n")
    stage = "  {}:\n    cmd: x\n    deps:\n    - {}\n    - src/aiayn/stages/{}.py\n    outs: [artifacts/{}]\n"
    (root / "dvc.yaml").write_text("stages:\n" + stage.format("corpus", "${data.corpus.path}", "corpus", "corpus")
                                   + stage.format("prepare", "artifacts/corpus", "prepare", "prepared")
                                   + stage.format("train", "artifacts/prepared", "train", "model"))
    entry = "  {}:\n    cmd: x\n    deps:\n    - path: {}\n      md5: {}\n    outs:\n    - path: artifacts/{}\n      md5: {}\n"
    (root / "dvc.lock").write_text("schema: '2.0'\nstages:\n"  # the run before's lock: every hash stale
                                   + entry.format("corpus", "corpora/mine", "1111old.dir", "corpus", "2222old.dir")
                                   + entry.format("prepare", "artifacts/corpus", "2222old.dir", "prepared", "3333old.dir")
                                   + entry.format("train", "artifacts/prepared", "3333old.dir", "model", "4444old.dir"))
    client = MlflowClient(tracking_uri=uri)

    def run(name: str, out: str, params: dict | None = None) -> tuple[dict, dict]:
        with Tracker(name, project_root=root, tracking_uri=uri, params=params) as t:
            (root / "artifacts" / out).mkdir(parents=True, exist_ok=True)
            (root / "artifacts" / out / "train.en").write_text(f"new {out}\n")
            ids = t.run_id, t.parent_run_id
        return client.get_run(ids[0]).data.tags, client.get_run(ids[1]).data.tags

    (root / "corpora" / "theirs").mkdir()
    (root / "corpora" / "theirs" / "train.en").write_text("another corpus\n")
    own, _ = run("corpus", "corpus", {"data": {"corpus": {"path": "corpora/theirs"}}})  # aiayn corpus --params F
    assert own["data.version"] == own["data_hash.corpora/theirs"] == dvc_hash(root / "corpora/theirs")
    own, parent = run("corpus", "corpus")
    assert own["data.version"] == parent["data.version"] == dvc_hash(root / "corpora/mine") != "1111old.dir"
    assert own["data_hash.artifacts/corpus"] == parent["data_hash.artifacts/corpus"] == dvc_hash(root / "artifacts/corpus")
    assert "data_hash.artifacts/prepared" not in own and "data_hash.artifacts/model" not in own  # later stages'
    own, parent = run("prepare", "prepared")
    assert own["data.version"] == parent["data.version"] == dvc_hash(root / "corpora/mine")  # not the lock's
    assert not {"1111old.dir", "2222old.dir", "3333old.dir", "4444old.dir"} & set(parent.values())  # the lock's
    assert own["data_hash.artifacts/corpus"] == dvc_hash(root / "artifacts/corpus") != "2222old.dir"
    assert own["data_hash.artifacts/prepared"] == parent["data_hash.artifacts/prepared"] == dvc_hash(
        root / "artifacts/prepared") != "3333old.dir"
    assert "data_hash.artifacts/model" not in own
    own, parent = run("train", "model")
    assert own["data_hash.artifacts/model"] == parent["data_hash.artifacts/model"] == dvc_hash(root / "artifacts/model")
    assert own["data_hash.artifacts/model"] != "4444old.dir"
    hashes = Path(client.download_artifacts(client.get_run(own["mlflow.parentRunId"]).info.run_id,
                                            "lineage/dvc_hashes.json", str(tmp_path)))
    assert "4444old.dir" not in hashes.read_text() and dvc_hash(root / "artifacts/model") in hashes.read_text()


def test_the_model_card_names_the_data_on_disk_not_a_stale_lock(tmp_path):
    """The export stage's model card (``_data_hashes``) read ``dvc.lock``, which is a run behind whenever stages run
    outside DVC (``aiayn prepare`` ... ``aiayn export``, README "one stage"): in a fresh clone the committed lock named
    the main job's Multi30k data for a model made from a corpus of one's own. Now it hashes what is on disk, and
    names the corpus of the config the stage ran with (``--params mine.yaml``), not ``params.yaml``'s."""
    from aiayn.config.schema import Params, load_params
    from aiayn.provenance import dvc_hash
    from aiayn.stages import Layout
    from aiayn.stages.export import _data_hashes

    root = tmp_path / "project"
    root.mkdir()
    for name in ("dvc.yaml", "dvc.lock"):  # the project's pipeline, and its lock from the main job's run
        shutil.copy(REPO / name, root / name)
    for rel in ("corpora/mine/train.en", "artifacts/corpus/train.en", "artifacts/prepared/train.en",
                "artifacts/tokenized/train.ids"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"made here: {rel}\n")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")  # data/multi30k
    mine = load_params(REPO / "params.yaml").model_dump(mode="json")
    mine["data"]["corpus"]["path"] = "corpora/mine"
    stale = {e["md5"] for st in yaml.safe_load((root / "dvc.lock").read_text())["stages"].values()
             for key in ("deps", "outs") for e in st.get(key, [])}
    card = _data_hashes(Layout(root), Params.model_validate(mine))
    assert list(card) == ["corpora/mine", "artifacts/corpus", "artifacts/prepared", "artifacts/tokenized"]
    assert all(card[p] == dvc_hash(root / p) for p in card) and not set(card.values()) & stale


def test_the_source_dataset_is_the_corpus_the_stage_reads(tmp_path):
    """The train run's ``source`` dataset input is the corpus the stage's config names, hashed now, not every
    ``*.dvc`` file's output (which would list Multi30k as what a run on a corpus of one's own, ``../extmine``,
    was trained from); Multi30k's is still described by ``data.dvc``'s record."""
    from aiayn.provenance import dvc_hash
    from aiayn.tracking.lineage import dvc_datasets

    for name in ("dvc.yaml", "data.dvc", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "corpora" / "mine").mkdir(parents=True)
    (tmp_path / "corpora" / "mine" / "train.en").write_text("my own corpus\n")
    multi30k = yaml.safe_load((REPO / "data.dvc").read_text())["outs"][0]
    (default,) = dvc_datasets(tmp_path, source_data=True)
    assert (default["name"], default["digest"]) == ("data/multi30k", multi30k["md5"].removesuffix(".dir"))
    assert default["source"].startswith("data.dvc: data/multi30k")
    (mine,) = dvc_datasets(tmp_path, source_data=True, params={"data": {"corpus": {"path": "corpora/mine"}}})
    assert mine["name"] == "corpora/mine" and mine["digest"] == dvc_hash(tmp_path / "corpora/mine").removesuffix(".dir")
    assert json.loads(mine["profile"]) == {"files": 1, "bytes": 14}


def test_a_stage_run_reads_each_file_of_its_lineage_once(tmp_path, monkeypatch):
    """A stage run's tracking read a file once per use: the ``train`` run read a corpus of one's own twice (its data
    version, its source dataset) and each training file three times (its folder's hash, the dataset digest, a line
    count); the ``evaluate`` run the corpus twice (a dependency, its data version) and each test file three times.
    Seconds a stage on a corpus the size of WMT14's
    (``benchmarks/perf/lineage_reads.py``). Now each file is read once per run (``aiayn.provenance.Digests``), and what the
    memo gives is what a fresh read gives."""
    import collections
    import pathlib

    from mlflow import MlflowClient

    from aiayn.provenance import dvc_hash
    from aiayn.stages import Layout, split_reads
    from aiayn.stages.evaluate import RECORD as EVALUATE
    from aiayn.stages.train import RECORD as TRAIN
    from aiayn.tracking import Tracker

    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    root, uri = tmp_path / "project", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    root.mkdir()
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", "data.dvc"):  # the project's pipeline and main-job lock
        shutil.copy(REPO / name, root / name)
    for folder in ("corpora/mine", "artifacts/corpus", "artifacts/prepared", "artifacts/tokenized"):
        for split in ("train", "val"):
            for lang in ("en", "de"):
                (root / folder).mkdir(parents=True, exist_ok=True)
                (root / folder / f"{split}.{lang}").write_text(f"{folder} {split}\n{lang}")  # no last newline
    params = {"data": {"corpus": {"path": "corpora/mine"}}}
    opened: collections.Counter[str] = collections.Counter()
    real_open = pathlib.Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        if "r" in mode and "b" in mode and root in self.absolute().parents:
            opened[self.absolute().relative_to(root).as_posix()] += 1
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", counting_open)
    testing = EVALUATE.reading(*split_reads(Layout(root), ["val"], ["en", "de"], "test"))
    training = TRAIN.reading(*split_reads(Layout(root), ["train", "val"], ["en", "de"], "training"))
    client = MlflowClient(tracking_uri=uri)
    for record in (testing, training):
        opened.clear()
        with Tracker(record, project_root=root, tracking_uri=uri, params=params) as t:
            run_id = t.run_id
        assert opened and max(opened.values()) == 1, (record.stage, dict(opened))
    run = client.get_run(run_id)
    assert run.data.tags["data.version"] == dvc_hash(root / "corpora/mine")
    profiles = {i.dataset.name: json.loads(i.dataset.profile) for i in run.inputs.dataset_inputs}
    assert profiles["train.en"] == {"lines": 2, "bytes": len("artifacts/prepared train\nen")}
    assert profiles["corpora/mine"] == {"files": 4, "bytes": sum(f.stat().st_size for f in (root / "corpora/mine")
                                                                  .iterdir())}


def test_the_memo_rereads_a_changed_file_and_paths_are_named_one_way(tmp_path):
    """``Digests`` serves a file from memory only while it is unchanged (path, inode, size, mtime), and equals a
    fresh read; ``project_path`` is the one rule for naming a data path, inside the project or outside it."""
    import os

    from aiayn.provenance import Digests, file_digest, project_path

    f = tmp_path / "train.en"
    f.write_text("one\ntwo\n")
    digests = Digests()
    assert digests(f) == digests(f) == file_digest(f) and digests.reads == 1
    f.write_text("three\n")  # another size
    assert digests(f) == file_digest(f) and digests.reads == 2
    st = f.stat()
    f.write_text("four!\n")  # the same size, then the same mtime: the inode alone tells nothing; the mtime does
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert digests(f).md5 == file_digest(f).md5 and digests.reads == 3
    assert file_digest(f).lines == 1 and file_digest(f).size == 6
    root = tmp_path / "project"
    cases = {"data/multi30k": "data/multi30k", "./data//multi30k/": "data/multi30k",
             f"{root}/corpora/mine": "corpora/mine", "../extmine": f"{tmp_path}/extmine",
             "/srv/corpus": "/srv/corpus", ".": str(root), "data/../..": str(tmp_path), "..x/y": "..x/y"}
    assert {p: project_path(root, p) for p in cases} == cases


def test_dvc_hash_leaves_out_what_dvc_ignores_inside_the_project(tmp_path, monkeypatch):
    """Inside the project DVC hashes a folder without its ``.git``, ``.hg`` and ``.dvc`` folders and without what
    the project's ``.dvcignore`` matches; outside it, every file. ``dvc_hash`` hashed every file everywhere, so a
    corpus cloned with git into the project (``git clone .../multi30k/dataset corpora/multi30k``) got a
    ``data.version`` and model-card hash that were not ``dvc.lock``'s, after an MD5 read of its git history. Now both
    sides equal a real ``dvc repro``'s lock, and ``source_corpus`` counts the files DVC counts."""
    from dvc.repo import Repo

    from aiayn.provenance import dvc_hash
    from aiayn.tracking.lineage import source_corpus

    def corpus(folder: Path) -> None:
        for rel, text in {".git/HEAD": "ref: main\n", ".git/objects/ab": "blob\n", ".hg/store": "hg\n",
                          "train.en": "a dog runs\n", "notes.tmp": "scratch\n", "keep.tmp": "kept\n",
                          "sub/x.de": "ein Hund\n", "cache/y": "y\n", "sub/cache/z": "z\n", "a.pyc": "pyc\n"}.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)

    root, outside = tmp_path / "project", tmp_path / "theirs"
    corpus(root / "corpora" / "mine")
    corpus(outside)
    (root / ".dvcignore").write_text("# scratch files\n*.tmp\n!keep.tmp\n/corpora/mine/cache/\n")
    (root / "corpora" / ".dvcignore").write_text("*.pyc\n")  # a .dvcignore on the way down counts too
    (root / "dvc.yaml").write_text(f"stages:\n  s:\n    cmd: echo > out.txt\n    deps:\n    - corpora/mine\n"
                                   f"    - {outside}\n    outs: [out.txt]\n")
    monkeypatch.chdir(root)
    with Repo.init(str(root), no_scm=True, force=True) as repo:
        repo.reproduce()
    lock = {e["path"]: e for e in yaml.safe_load((root / "dvc.lock").read_text())["stages"]["s"]["deps"]}
    assert lock["corpora/mine"]["nfiles"] == 4 and lock[outside.as_posix()]["nfiles"] == 10  # DVC's own counts
    assert dvc_hash(root / "corpora/mine", project_root=root) == lock["corpora/mine"]["md5"]
    assert dvc_hash(outside, project_root=root) == lock[outside.as_posix()]["md5"]
    (root / "dvc.yaml").write_text("stages:\n  corpus:\n    cmd: x\n    deps: [corpora/mine]\n    outs: [artifacts]\n")
    (seen,) = source_corpus(root)
    assert seen["digest"] == lock["corpora/mine"]["md5"].removesuffix(".dir")
    assert json.loads(seen["profile"])["files"] == 4
