"""What ``data.dvc`` versions and what the pipeline reports of it: Multi30k's folder only, a corpus of one's
own (under ``data/`` or elsewhere) outside it, the cache step that never commits data that differs, and the
report after a ``dvc repro`` that re-versioned a data source (stop 43)."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_cache_data_commits_only_data_that_matches_its_dvc_file(tmp_path, prefect_harness, monkeypatch):
    """A ``.dvc`` file whose data the cache lacks (a fresh clone) and whose output folder holds other data
    (here ``data/`` with a corpus of the user's own, as ``data.dvc`` versioned until stop 43) must give a
    warning, not a crash, and stay as it was. DVC's status says only "not in cache" there whatever the
    workspace holds: the old code took that for "same hash" and ``repo.commit`` raised ``StageCommitError``,
    failing ``make run`` before any stage."""
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
