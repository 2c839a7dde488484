"""Where the code and data came from: the git commit, and DVC's content hashes of the data.

Pure functions of the project's files (``git``, ``dvc.lock``, the top-level ``*.dvc`` files): no DVC
import (DVC's files are parsed as YAML), no MLflow. The export stage writes ``dvc_data_hashes`` into
the serving bundle's model card; tracking tags every run with both.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

__all__ = ["git_commit", "dvc_data_hashes", "dvc_file_outs", "dvc_out_hash", "file_digest",
           "FileDigest", "Digests", "PIPELINE_WRITES",
           "is_code_path", "data_version", "CorpusInput", "corpus_input", "dvc_hash", "StagePaths", "stage_paths",
           "CORPUS_STAGE", "current_hashes", "project_path",
           "data_files", "DVC_DEFAULT_IGNORES"]

#: The stage that reads the raw corpus (``dvc.yaml``); its data dependency is the run's data version.
CORPUS_STAGE = "corpus"

#: What the pipeline itself writes inside a project (git pathspecs): a ``dvc repro`` rewrites ``dvc.lock``, the
#: stages write ``artifacts/``, tracking keeps its state in ``.aiayn/`` (and the default stores). None of it is the
#: user's code, so none of it makes the work tree "dirty" (``git_commit``).
PIPELINE_WRITES = ("dvc.lock", "artifacts", ".aiayn", "mlflow.db", "mlruns", "data", "serving", ".dvc-remote")

#: Folders of the project's code: their DVC hashes are the git commit's business, not the data's.
_CODE_ROOTS = ("src", "monitoring", "pipelines", "benchmarks", "tests")


def git_commit(project_root: str | Path, *, ignore: tuple[str, ...] = PIPELINE_WRITES) -> tuple[str | None, bool]:
    """``(HEAD commit sha, dirty)`` of the git work tree holding ``project_root``.

    ``dirty`` is True when tracked files differ from HEAD (untracked files are
    ignored: they are not part of any commit), except the paths in ``ignore`` (git
    pathspecs relative to ``project_root``; default ``PIPELINE_WRITES``: what the pipeline
    itself writes, e.g. the ``dvc.lock`` of a fresh clone's first run). ``(None, False)``
    outside a git work tree or without a ``git`` executable. Never raises.
    """

    def _git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(project_root), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = _git("rev-parse", "--verify", "HEAD")
    if head is None:
        return None, False
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ":/", *(f":(exclude){p}" for p in ignore))
    return head.strip(), bool(status and status.strip())


def dvc_out_hash(entry: Mapping[str, Any]) -> str | None:
    """DVC's hash of a ``deps``/``outs`` entry: its ``md5``, else ``etag``, else ``checksum``; None if none."""
    for key in ("md5", "etag", "checksum"):
        if entry.get(key):
            return str(entry[key])
    return None


def _local_path(path: Any) -> str | None:
    """Normalised POSIX path relative to the project root, or None if not a path inside it as written."""
    if not isinstance(path, str) or "://" in path or path.startswith("/"):
        return None
    norm = posixpath.normpath(path)
    return None if norm == "." or norm == ".." or norm.startswith("../") else norm


def dvc_data_hashes(project_root: str | Path) -> dict[str, str]:
    """DVC content hashes of every data path the pipeline knows, keyed by path.

    Reads ``<project_root>/dvc.lock`` (every stage's ``deps`` and ``outs``; an
    ``outs`` entry wins over a ``deps`` entry for the same path) and each
    ``<project_root>/*.dvc`` file (``outs``, paths relative to the ``.dvc``
    file). Values are DVC's ``md5`` (``...dir`` for directories; ``etag`` or
    ``checksum`` for remote-style entries). Keys are POSIX paths relative to
    the project root, e.g. ``{"artifacts/prepared": "3f2a...dir"}``. Missing
    files give an empty dict. Never imports dvc (parses YAML).

    Raises:
        ValueError: a file is not valid YAML or not shaped like a DVC lock /
            ``.dvc`` file; the message names the file.
    """
    root = Path(project_root)
    deps: dict[str, str] = {}
    outs: dict[str, str] = {}
    lock = root / "dvc.lock"
    for name, stage in _lock_stages(root).items():
        for target, key in ((deps, "deps"), (outs, "outs")):
            for entry in _entries(lock, stage.get(key), f"stages.{name}.{key}"):
                p, h = _local_path(entry.get("path")), dvc_out_hash(entry)
                if p and h:
                    target[p] = h

    for dvc_file, entry in dvc_file_outs(root, strict=True):
        p, h = _local_path(entry.get("path")), dvc_out_hash(entry)
        if p and h:
            outs[p] = h

    return {**deps, **outs}


class CorpusInput(NamedTuple):
    """The data the ``corpus`` stage read, as ``dvc.lock`` records its dependency."""

    path: str  #: POSIX, relative to the project root (``data/multi30k``, ``corpora/mine``); absolute outside it
    md5: str | None  #: DVC's hash (``...dir`` for a folder); None if the entry has none


def corpus_input(project_root: str | Path) -> CorpusInput | None:
    """What the run's corpus is: the ``corpus`` stage's data dependency in ``<project_root>/dvc.lock``.

    The one rule for "which corpus" (MLflow's ``data.version``, the model card's data hashes, the pipeline
    report's data line). DVC writes a path inside the project relative to it however ``data.corpus.path``
    gave it, and keeps the path and hash of a corpus outside the project as written (``/srv/corpora/mine``,
    ``../mine``, named here by its absolute path: ``project_path``), which ``dvc_data_hashes`` leaves out. A Hugging
    Face hub dataset has no local data (DVC watches its loader, ``src/aiayn/data/hub.py``): the stage's snapshot of
    it, ``artifacts/corpus``, with the resolved revision in its ``SOURCE.json``. None before the corpus stage has run
    (no ``dvc.lock``, no ``corpus`` entry).

    Raises:
        ValueError: ``dvc.lock`` is not valid YAML or not shaped like a lock file; the message names it.
    """
    root = Path(project_root)
    stage = _lock_stages(root).get("corpus") or {}
    for entry in _entries(root / "dvc.lock", stage.get("deps"), "stages.corpus.deps"):
        path = entry.get("path")
        if not isinstance(path, str) or "://" in path:
            continue
        path = project_path(root, path)  # inside the project, or outside it as written (``../corpus``): absolute
        if not is_code_path(path):
            return CorpusInput(path, dvc_out_hash(entry))
    for entry in _entries(root / "dvc.lock", stage.get("outs"), "stages.corpus.outs"):  # no local data: a hub
        if path := _local_path(entry.get("path")):  # dataset (DVC watches its loader); the snapshot it made
            return CorpusInput(path, dvc_out_hash(entry))
    return None


def project_path(project_root: str | Path, path: str) -> str:
    """How lineage names a data path (``dvc.yaml``'s, ``dvc.lock``'s, a config's): POSIX and normalised, relative to
    the project root inside it, absolute outside it (``../corpus`` and ``/srv/corpus`` alike) or when it is the root."""
    base = Path(project_root).absolute().as_posix()
    full = posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(base, path))
    inside = posixpath.relpath(full, base)
    return full if inside in (".", "..") or inside.startswith("../") else inside


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from e


def _entries(path: Path, block: Any, what: str) -> list[Mapping[str, Any]]:
    """A ``deps``/``outs`` block: a list of mappings ([] when absent); ValueError naming ``path`` otherwise."""
    if block is None:
        return []
    if not isinstance(block, list) or not all(isinstance(x, Mapping) for x in block):
        raise ValueError(f"{path}: {what} must be a list of mappings, got {block!r:.200}")
    return block


def _lock_stages(root: Path) -> Mapping[str, Mapping[str, Any]]:
    """``dvc.lock``'s stages by name ({} without a ``dvc.lock``); ValueError naming the file if malformed."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    doc = _load_yaml(lock) or {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{lock}: expected a mapping at top level, got {type(doc).__name__}")
    stages = doc.get("stages", {}) if "schema" in doc else doc  # schema 2.0 vs 1.0
    if not isinstance(stages, Mapping):
        raise ValueError(f"{lock}: 'stages' must be a mapping, got {stages!r:.200}")
    for name, stage in stages.items():
        if not isinstance(stage, Mapping):
            raise ValueError(f"{lock}: stage {name!r} must be a mapping, got {stage!r:.200}")
    return stages


def dvc_file_outs(project_root: str | Path, *, strict: bool) -> list[tuple[Path, Mapping[str, Any]]]:
    """``(dvc_file, out_entry)`` for every ``outs`` entry of the project's top-level ``*.dvc`` files.

    The one reader of ``.dvc`` files (``dvc_data_hashes``; tracking's dataset inputs). ``strict``:
    raise ``ValueError`` naming the file when one is not valid YAML or not shaped like a ``.dvc``
    file; otherwise skip such a file (a dataset description must never stop a stage).
    """
    root = Path(project_root)
    found: list[tuple[Path, Mapping[str, Any]]] = []
    for dvc_file in sorted(p for p in root.glob("*.dvc") if p.is_file()):  # not the .dvc/ directory
        try:
            doc = yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}
            if not isinstance(doc, Mapping):
                raise ValueError(f"{dvc_file}: expected a mapping at top level, got {type(doc).__name__}")
            entries = doc.get("outs") or []
            if not isinstance(entries, list) or not all(isinstance(x, Mapping) for x in entries):
                raise ValueError(f"{dvc_file}: outs must be a list of mappings, got {entries!r:.200}")
        except (OSError, yaml.YAMLError, ValueError) as e:
            if strict:
                raise ValueError(str(e) if isinstance(e, ValueError) else f"{dvc_file}: not valid YAML: {e}") from e
            continue
        found.extend((dvc_file, entry) for entry in entries)
    return found


class FileDigest(NamedTuple):
    """One read of a file (``file_digest``): DVC 3's content hash of it and what a dataset profile shows."""

    md5: str  #: MD5 of its bytes: DVC 3's content hash of a file
    lines: int  #: lines, as iterating the open file counts them (a last line without a newline is one)
    size: int  #: bytes


def file_digest(path: Path) -> FileDigest:
    """``FileDigest`` of ``path`` in one read of its bytes (OSError if it cannot be read). Lines are counted with
    numpy (~19 GB/s a core here, against 3.9 for ``bytes.count`` and 0.8 for MD5: ``benchmarks/perf/lineage_reads.py``)."""
    import numpy as np

    h, lines, size, last = hashlib.md5(), 0, 0, b"\n"  # noqa: S324 - DVC's content hash, not security
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            lines += int(np.count_nonzero(np.frombuffer(block, np.uint8) == 0x0A))  # b"\n"
            size, last = size + len(block), block[-1:]
    return FileDigest(h.hexdigest(), lines + (last != b"\n"), size)


class Digests:
    """``file_digest`` of each file, read once while it is unchanged: the memo of one stage run's lineage.

    A stage run's tracking hashes the same corpus for what the stage reads, for its data version and for its dataset
    inputs, and counts lines of files it just hashed (``aiayn.tracking``); without a memo each read every byte again
    (an ``evaluate`` run read a corpus of one's own twice and each test file three times). A file counts as
    unchanged while its absolute path, device, inode, size and modification time (ns) are: DVC's own rule for
    trusting a hash it has (its state database). Keep one for the life of one stage run, whose inputs DVC requires
    it not to modify.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, int, int, int], FileDigest] = {}
        self.reads = 0  #: files read so far (the rest came from the memo)

    def __call__(self, path: Path) -> FileDigest:
        st = path.stat()
        key = (path.absolute().as_posix(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = file_digest(path)
            self.reads += 1
        return found


#: What DVC never hashes in a folder inside the project, whatever its ``.dvcignore`` says (``dvc.ignore``'s
#: ``DvcIgnoreFilter``), in the ``.dvcignore`` syntax.
DVC_DEFAULT_IGNORES = (".hg/", ".git/", ".git", ".dvc/")


def data_files(folder: str | Path, project_root: str | Path | None = None) -> list[tuple[str, Path]]:
    """The files DVC hashes in ``folder``, as ``(relpath, path)`` sorted by ``relpath`` (POSIX, relative to
    ``folder``). Outside ``project_root`` (or without one) every file, as DVC walks a dependency outside its repo.
    Inside it, not what DVC leaves out there: ``DVC_DEFAULT_IGNORES`` and what the ``.dvcignore`` files of the
    project root and of each folder on the way down to ``folder`` match (gitignore rules, stripped lines, a deeper
    file's match winning: how ``dvc.ignore`` reads them, with the same ``pathspec``; DVC refuses a ``.dvcignore``
    inside a folder it hashes). Folders are not followed through symlinks. Checked against ``dvc repro`` in
    ``tests/test_data_versions.py``."""
    top = Path(folder).absolute()
    root = Path(project_root).absolute() if project_root is not None else None
    specs = _ignore_specs(root, top) if root is not None and top.is_relative_to(root) else []

    def ignored(path: Path, is_dir: bool) -> bool:
        verdict = None
        for base, spec in specs:
            found = spec.check_file(path.relative_to(base).as_posix() + ("/" if is_dir else "")).include
            verdict = verdict if found is None else found
        return bool(verdict)

    out = []
    for here, dirs, files in os.walk(top):
        base = Path(here)
        dirs[:] = [d for d in dirs if not ignored(base / d, True)]
        out += [((base / f).relative_to(top).as_posix(), base / f) for f in files
                if (base / f).is_file() and not ignored(base / f, False)]
    return sorted(out)


def _ignore_specs(root: Path, top: Path) -> list[tuple[Path, Any]]:
    """``(folder, pathspec.GitIgnoreSpec)`` of DVC's defaults and of each ``.dvcignore`` from ``root`` down to
    ``top``, shallowest first."""
    from pathspec import GitIgnoreSpec

    specs = [(root, GitIgnoreSpec.from_lines(DVC_DEFAULT_IGNORES))]
    parts = top.relative_to(root).parts
    for here in (root.joinpath(*parts[:depth]) for depth in range(len(parts) + 1)):
        rules = here / ".dvcignore"
        if rules.is_file():
            lines = [ln.strip() for ln in rules.read_text(encoding="utf-8").splitlines()]
            specs.append((here, GitIgnoreSpec.from_lines([ln for ln in lines if ln and not ln.startswith("#")])))
    return specs


def dvc_hash(path: str | Path, digests: Digests | None = None, project_root: str | Path | None = None) -> str | None:
    """DVC 3's content hash (``hash: md5``) of a file or folder, as ``dvc.lock`` records it once the stage that
    wrote it ends: a file's MD5 (``file_digest``); a folder's ``<md5>.dir``, the MD5 of the JSON list
    ``[{"md5": ..., "relpath": ...}]`` of the files DVC hashes in it (``data_files``: inside ``project_root``, not
    what its ``.dvcignore`` and DVC's defaults leave out) sorted by ``relpath`` (dvc-data's ``Tree.as_bytes``;
    checked against ``dvc repro``'s lock in the tests). None when the path does not exist.

    Cost: one read of every byte (MD5: ~0.7 GB/s a core on an AMD Zen 4,
    docs/results.md#what-a-stage-runs-lineage-reads). ``digests``: a memo
    that reads each unchanged file once (``Digests``).
    """
    p, digest = Path(path), digests or file_digest
    if p.is_file():
        return digest(p).md5
    if not p.is_dir():
        return None
    entries = [{"md5": digest(f).md5, "relpath": rel} for rel, f in data_files(p, project_root)]
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"  # noqa: S324


def current_hashes(project_root: str | Path, paths: list[str] | tuple[str, ...],
                   digests: Digests | None = None) -> dict[str, str]:
    """``{path: DVC hash}`` of each path (``stage_paths``' form) as it is now: a top-level ``*.dvc`` file's record of it
    (DVC's own, current record: ``data.dvc``'s Multi30k), else hashed from the files (``dvc_hash``). ``dvc.lock`` is
    not read: it holds a stage's hashes from that stage's last ``dvc repro``, not what ``aiayn <stage>`` or a
    running stage has written since. Paths that do not exist are left out. ``digests``: as ``dvc_hash``'s.

    Raises:
        ValueError: a ``*.dvc`` file is not valid YAML (``dvc_file_outs``).
    """
    recorded = {str(e.get("path")): dvc_out_hash(e) for _, e in dvc_file_outs(project_root, strict=True)}
    found = {p: recorded.get(p) or dvc_hash(Path(project_root) / p, digests, project_root) for p in paths}
    return {p: h for p, h in found.items() if h}


class StagePaths(NamedTuple):
    """The data paths of one ``dvc.yaml`` stage (POSIX, relative to the project root; absolute outside it)."""

    deps: tuple[str, ...]  #: the data it reads (``deps`` without the code: ``is_code_path``)
    outs: tuple[str, ...]  #: what it writes (``outs``, ``metrics``, ``plots``)


_TEMPLATE = re.compile(r"\$\{\s*([\w.-]+)\s*\}")


def stage_paths(project_root: str | Path, stage: str, params: Mapping[str, Any] | None = None) -> StagePaths | None:
    """What ``dvc.yaml``'s ``stage`` reads and writes, its ``${a.b}`` templates filled from ``params`` (the config the
    stage runs with: ``aiayn <stage> --params FILE`` need not be ``params.yaml``) or, without it, from ``params.yaml``
    (what ``dvc repro`` fills them from); a path with a template they do not fill is left out. None when there is no
    ``dvc.yaml`` or it has no such stage.

    Raises:
        ValueError: ``dvc.yaml`` (or ``params.yaml``) is not valid YAML; the message names the file.
    """
    root = Path(project_root)
    doc = _load_yaml(root / "dvc.yaml") if (root / "dvc.yaml").is_file() else None
    stages = doc.get("stages") if isinstance(doc, Mapping) else None
    spec = stages.get(stage) if isinstance(stages, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    given: list[Any] = [] if params is None else [params]  # else params.yaml, read on the first template

    def fill(match: re.Match[str]) -> str:
        if not given:
            given.append(_load_yaml(root / "params.yaml") if (root / "params.yaml").is_file() else {})
        value: Any = given[0]
        for key in match.group(1).split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is None or isinstance(value, (Mapping, list)):
            raise KeyError(match.group(1))
        return str(value)

    def path(entry: Any) -> str | None:
        raw = next(iter(entry), None) if isinstance(entry, Mapping) else entry  # `- path: {cache: false}`
        if not isinstance(raw, str) or "://" in raw:
            return None
        try:
            raw = _TEMPLATE.sub(fill, raw)
        except KeyError:
            return None
        return project_path(root, raw)

    def paths(*keys: str) -> list[str]:
        found = [path(e) for key in keys for e in (spec.get(key) or [])]
        return list(dict.fromkeys(p for p in found if p))

    return StagePaths(tuple(p for p in paths("deps") if not is_code_path(p)), tuple(paths("outs", "metrics", "plots")))


def is_code_path(path: str) -> bool:
    """Whether a project-relative POSIX path (a ``dvc.lock`` dep) is the project's code (a ``.py`` file or a path
    under a code folder) rather than data or a stage's output."""
    return path.endswith(".py") or path.split("/", 1)[0] in _CODE_ROOTS


def data_version(hashes: dict[str, str]) -> str | None:
    """The raw data's version from ``dvc_data_hashes``: the hash of the first path under ``data/`` (``data.dvc``'s
    corpus), None when there is none."""
    raw = sorted(p for p in hashes if p == "data" or p.startswith("data/"))
    return hashes[raw[0]] if raw else None
