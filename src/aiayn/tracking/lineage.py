"""Lineage as MLflow records it: the tags of every pipeline and stage run, and a stage's dataset inputs.

Built on ``aiayn.provenance`` (git commit, DVC hashes) and told by the stage's ``StageRecord`` which
files it reads; no MLflow import here (the caller logs what these return).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiayn.provenance import (
    CORPUS_STAGE,
    Digests,
    corpus_input,
    data_version,
    dvc_data_hashes,
    current_hashes,
    data_files,
    dvc_file_outs,
    dvc_hash,
    dvc_out_hash,
    file_digest,
    git_commit,
    is_code_path,
    stage_paths,
)
from aiayn.recording import BAD_KEY_CHARS, MAX_KEY_LEN, DatasetRead

__all__ = ["git_tags", "lineage_tags", "dvc_datasets", "lineage_hashes", "corpus_version", "stage_data", "stage_tags",
           "hash_tags", "current_data_version", "source_corpus"]

log = logging.getLogger("aiayn.tracking")


def git_tags(project_root: Path) -> dict[str, str]:
    """``git.dirty`` (the user's code only: ``aiayn.provenance.git_commit`` leaves out what the pipeline writes) and,
    inside a git work tree, ``git.commit`` / ``mlflow.source.git.commit``."""
    commit, dirty = git_commit(project_root)
    tags = {"git.dirty": str(dirty).lower()}
    if commit:
        tags["git.commit"] = tags["mlflow.source.git.commit"] = commit
    return tags


def dvc_datasets(project_root: str | Path, reads: Iterable[DatasetRead] = (), *, source_data: bool = False,
                 params: Mapping[str, Any] | None = None, digests: Digests | None = None) -> list[dict[str, str]]:
    """The DVC-versioned data a stage reads, described as MLflow dataset inputs.

    ``source_data``: first the raw corpus the ``corpus`` stage reads by ``params`` (the stage's config; default
    ``params.yaml``; ``source_corpus``), context ``source``: name = its path, digest = DVC's hash without its
    ``.dir`` suffix. Then one dataset per file of ``reads`` (paths relative to ``project_root``): name = the file's
    name, digest = its MD5, which is DVC 3's content hash of that file (so it matches the ``.dir``
    manifest of its folder in the DVC cache); source = its path; context = the read's; profile =
    lines and bytes. Missing files are skipped. ``digests``: the stage run's memo (``aiayn.provenance.Digests``), so
    a file its lineage hashed already is not read again.

    Returns:
        ``[{"name", "digest", "source", "context", "profile"}]`` (all strings).
    """
    root, digest = Path(project_root), digests or file_digest
    out = source_corpus(root, params, digests) if source_data else []
    for read in reads:
        f = root / read.path
        if not f.is_file():
            continue
        found = digest(f)
        out.append({"name": f.name, "digest": found.md5, "source": f.relative_to(root).as_posix(),
                    "context": read.context, "profile": json.dumps({"lines": found.lines, "bytes": found.size})})
    return out


def source_corpus(project_root: Path, params: Mapping[str, Any] | None = None,
                  digests: Digests | None = None) -> list[dict[str, str]]:
    """The raw corpus as ``dvc_datasets``' ``source`` dataset: the ``corpus`` stage's data dependency in ``dvc.yaml``,
    filled from ``params`` (a hub dataset's snapshot ``artifacts/corpus`` when it has none), named by its path and
    hashed now (``aiayn.provenance.current_hashes``); a path a ``*.dvc`` file records is described by that record
    (``data.dvc: data/multi30k``). Without a ``corpus`` stage (or an unreadable ``dvc.yaml``): every ``*.dvc``
    file's output (the old rule for every run, which named Multi30k for a run on a corpus of one's own)."""
    recorded = {str(e.get("path")): (f, e) for f, e in dvc_file_outs(project_root, strict=False)}
    try:
        corpus = stage_paths(project_root, CORPUS_STAGE, params)
    except ValueError as e:
        log.warning("source dataset from the *.dvc files: %s", e)
        corpus = None
    paths = list(recorded) if corpus is None else list(corpus.deps[:1] or corpus.outs[:1])
    out = []
    for path in paths:
        if path in recorded:
            dvc_file, entry = recorded[path]
            h, where = dvc_out_hash(entry), f"{dvc_file.name}: {path}"
            files, size = entry.get("nfiles"), entry.get("size")
        else:
            full = Path(project_root) / path
            h, where = dvc_hash(full, digests, project_root), path
            found = [f for _, f in data_files(full, project_root)] if full.is_dir() else [full]
            files, size = len(found), sum(f.stat().st_size for f in found if f.exists())
        if h:
            out.append({"name": path, "digest": h.removesuffix(".dir"), "source": f"{where} (DVC {h})",
                        "context": "source", "profile": json.dumps({"files": files, "bytes": size})})
    return out


def lineage_hashes(project_root: Path) -> dict[str, str]:
    """Every ``dvc_data_hashes`` entry (code and data): what the tracker logs as ONE artifact of the pipeline run
    (``lineage/dvc_hashes.json``). Empty, with one warning, when a DVC file is unreadable."""
    try:
        return dvc_data_hashes(project_root)
    except ValueError as e:
        log.warning("no data hashes logged: %s", e)
        return {}


def lineage_tags(project_root: Path, hashes: dict[str, str] | None = None) -> dict[str, str]:
    """The tags of every pipeline and stage run: ``git_tags``, ``dvc.exp_name`` when DVC runs the
    stage as an experiment (``DVC_EXP_NAME``, set by ``dvc exp run --queue/--temp``), ``data.version`` (the DVC hash
    of the corpus the run read: ``corpus_version``) and one ``data_hash.<path>`` per data path of ``hashes``
    (default ``lineage_hashes``): the corpus and the stages' outputs, not the code files (the git commit covers those;
    every hash is in the ``lineage/dvc_hashes.json`` artifact)."""
    hashes = lineage_hashes(project_root) if hashes is None else hashes
    tags = _run_tags(project_root)
    if version := corpus_version(project_root, hashes):
        tags["data.version"] = version
    return {**tags, **hash_tags(hashes)}


def _run_tags(project_root: Path) -> dict[str, str]:
    tags = git_tags(project_root)
    if os.environ.get("DVC_EXP_NAME"):  # set by DVC for queued / temp experiments
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


def hash_tags(hashes: dict[str, str]) -> dict[str, str]:
    """One ``data_hash.<path>`` tag per data path of ``hashes`` (code paths left out)."""
    return {BAD_KEY_CHARS.sub("_", f"data_hash.{path}")[:MAX_KEY_LEN]: h
            for path, h in hashes.items() if not is_code_path(path)}


def stage_data(project_root: Path, stage: str, *, side: str, params: Mapping[str, Any] | None = None,
               digests: Digests | None = None) -> dict[str, str] | None:
    """``{path: DVC hash}`` of what ``dvc.yaml``'s ``stage`` reads (``side="deps"``, taken when it starts) or wrote
    (``side="outs"``, when it ends), as they are then (``aiayn.provenance.current_hashes``): ``dvc.lock`` holds the run
    before's hashes of a stage's own entry until DVC rewrites it after the stage. ``params``: the stage's config, which
    fills ``dvc.yaml``'s templates (``aiayn.provenance.stage_paths``); ``digests``: the stage run's memo
    (``aiayn.provenance.Digests``). None when ``dvc.yaml`` does not define the stage, or it or a ``*.dvc`` file cannot
    be read (one warning)."""
    try:
        paths = stage_paths(project_root, stage, params)
        return None if paths is None else current_hashes(project_root, getattr(paths, side), digests)
    except ValueError as e:
        log.warning("no stage data hashes: %s", e)
        return None


def stage_tags(project_root: Path, stage: str, reads: dict[str, str], params: Mapping[str, Any] | None = None,
               digests: Digests | None = None) -> dict[str, str]:
    """The lineage tags of a stage's own run when it starts: ``git_tags``, ``dvc.exp_name``, ``data.version``
    (``current_data_version``) and a ``data_hash.<path>`` for each path it reads (``reads``: ``stage_data(...,
    side="deps")``). Never the hashes of what it writes or of later stages' outputs, which ``dvc.lock`` holds from
    the run before (``stage_data(..., side="outs")`` tags its outputs when it ends). ``params``: the stage's config;
    ``digests``: its run's memo (``aiayn.provenance.Digests``)."""
    tags = _run_tags(project_root)
    if version := current_data_version(project_root, params, snapshot=stage != CORPUS_STAGE, digests=digests):
        tags["data.version"] = version
    return {**tags, **hash_tags(reads)}


def current_data_version(project_root: Path, params: Mapping[str, Any] | None = None, *,
                         snapshot: bool = True, digests: Digests | None = None) -> str | None:
    """The run's data version as it is now: the DVC hash of the corpus the ``corpus`` stage reads by ``params``
    (``aiayn.provenance.stage_paths``, ``current_hashes``; ``data/multi30k`` by ``data.dvc``'s record) or, for a hub
    dataset with no local data, of its snapshot ``artifacts/corpus`` (``snapshot=False``: not before the corpus
    stage has written it: None). Without a ``corpus`` stage in ``dvc.yaml``, ``corpus_version``'s (``dvc.lock``).
    ``digests``: the stage run's memo (``aiayn.provenance.Digests``)."""
    try:
        corpus = stage_paths(project_root, CORPUS_STAGE, params)
        if corpus is None:
            return corpus_version(project_root, lineage_hashes(project_root))
        paths = corpus.deps[:1] or (corpus.outs[:1] if snapshot else ())
        return next(iter(current_hashes(project_root, paths, digests).values()), None)
    except ValueError as e:
        log.warning("no data version: %s", e)
        return None


def corpus_version(project_root: Path, hashes: dict[str, str]) -> str | None:
    """The run's data version: the DVC hash of what the ``corpus`` stage read (``aiayn.provenance.corpus_input``:
    its data dependency in ``dvc.lock``, ``data/multi30k`` or a corpus of one's own, inside the project or not);
    before that stage has run, ``aiayn.provenance.data_version(hashes)`` (the first path under ``data/``:
    ``data.dvc``'s Multi30k). None when neither is known; an unreadable ``dvc.lock`` counts as not yet run."""
    try:
        corpus = corpus_input(project_root)
    except (OSError, ValueError):  # unreadable: as if not yet run
        corpus = None
    return corpus.md5 if corpus else data_version(hashes)
