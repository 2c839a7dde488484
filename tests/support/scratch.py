"""A throwaway copy of the project for smoke runs, tests and benchmarks.

``scratch_project(dest, params)`` lays out a DVC project at ``dest`` that runs the
real pipeline on ``params`` (e.g. ``configs/smoke.yaml``) without touching the
project's own ``artifacts/``, ``data/``, ``mlflow.db`` or DVC cache:

``dest/params.yaml``  ``params`` fully resolved (every key written out, so each key
                      ``dvc.yaml`` tracks exists; loads back to the same ``Params``)
``dest/dvc.yaml``     the project's DAG, unchanged
``dest/*.dvc``        the project's data versions (``data.dvc``), unchanged, and its ``.dvcignore``
                      (``git=True``: its ``.gitignore`` too)
``dest/src/``         a copy of the core's sources (the stages' DVC ``deps``; the code
                      that runs is still the installed ``aiayn``)
``dest/.dvc/``        ``dvc init --no-scm`` (``git=True``: ``git init`` + ``dvc init``, what
                      ``dvc exp`` needs), default remote ``local`` = ``dest/.dvc-remote``;
                      the project's other remotes (``s3``) copied as they are

``data/`` is left empty: the ``fetch`` flow (or ``pipeline``) fills it.

``copy_project(src, dest)`` copies a built project (or an MLflow store folder) so that the copy refers
to itself only: what a test that changes a shared project works on.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["PROJECT_ROOT", "copy_project", "resolved_params_yaml", "scratch_project"]

#: The repository root (this file is ``<root>/tests/support/scratch.py``).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def resolved_params_yaml(params_path: str | Path) -> str:
    """``params.yaml`` text with every field of ``load_params(params_path)`` written out.

    Raises ``aiayn.config.schema.ConfigError`` for an invalid params file.
    """
    import yaml

    from aiayn.config.schema import load_params

    resolved = load_params(params_path).model_dump(mode="json")
    preset = resolved.pop("model_preset")
    resolved["model"] = {"preset": preset, **resolved["model"]}
    return f"# resolved from {params_path} by tests/support/scratch.py\n" + yaml.safe_dump(resolved, sort_keys=False)


def _shared_remotes(source: Path) -> dict[str, dict[str, str]]:
    """The remotes of ``source/.dvc/config`` other than ``local`` (e.g. ``s3``: a team bucket, selected
    with ``AIAYN_DVC_REMOTE``), as DVC config sections."""
    import re

    from configobj import ConfigObj

    path = source / ".dvc" / "config"
    remotes = {}
    for section, values in (ConfigObj(str(path)) if path.is_file() else {}).items():
        m = re.fullmatch(r'remote "(.+)"', section)
        if m and m.group(1) != "local":
            remotes[m.group(1)] = dict(values)
    return remotes


def scratch_project(dest: str | Path, params: str | Path, *, source: str | Path = PROJECT_ROOT,
                    git: bool = False) -> Path:
    """Create the scratch project at ``dest`` (must not exist or be empty); return its absolute path.

    Raises ``FileExistsError`` if ``dest`` is a non-empty directory, ``FileNotFoundError``
    if ``params`` or ``source/dvc.yaml`` is missing.
    """
    from dvc.repo import Repo

    from aiayn.config.schema import load_params

    dest, source, params = Path(dest).resolve(), Path(source).resolve(), Path(params)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"scratch project folder is not empty: {dest}")
    for needed in (params, source / "dvc.yaml"):
        if not needed.is_file():
            raise FileNotFoundError(f"scratch project: missing {needed}")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "params.yaml").write_text(resolved_params_yaml(params), encoding="utf-8")
    if load_params(dest / "params.yaml") != load_params(params):
        raise AssertionError(f"resolved params of {params} do not load back to the same values")
    # .dvcignore keeps bytecode caches out of the code deps' hashes; .gitignore (git only) keeps DVC's
    # data and outputs out of git, as in the project itself
    extras = [".dvcignore", *((".gitignore",) if git else ())]
    for name in ["dvc.yaml", *(p.name for p in source.glob("*.dvc") if p.is_file()), *extras]:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    for code in ("src", "monitoring"):  # dvc.yaml's code deps
        shutil.copytree(source / code, dest / code, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    if git:
        import subprocess

        subprocess.run(["git", "init", "-q", str(dest)], check=True, capture_output=True)
        for key, value in (("user.name", "aiayn tests"), ("user.email", "tests@aiayn.invalid")):
            # `dvc exp run` commits into git refs: a user account without a git identity (CI, a new
            # user) must still run the tests
            subprocess.run(["git", "-C", str(dest), "config", key, value], check=True, capture_output=True)
    with Repo.init(str(dest), no_scm=not git) as repo:
        with repo.config.edit() as conf:
            conf["core"]["remote"] = "local"
            conf["core"]["analytics"] = False
            conf["remote"]["local"] = {"url": str(dest / ".dvc-remote")}
            conf["remote"].update(_shared_remotes(source))
    return dest


def _sqlite_replace(db: Path, old: str, new: str) -> None:
    """Every text value in every table of SQLite database ``db`` with ``old`` replaced by ``new``."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        for table in tables:
            for column in [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]:
                con.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                            f'WHERE typeof("{column}") = \'text\' AND instr("{column}", ?) > 0', (old, new, old))
        con.commit()
    finally:
        con.close()


def _is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == b"SQLite format 3\x00"


#: Where ``copy_project`` rewrites text files: DVC's config (its ``local`` remote) and what MLflow and the
#: pipeline keep beside a store (artifacts, ``meta.yaml``, the pipeline run state). Never DVC-tracked
#: files (``data/``, ``artifacts/``, the code): their bytes are what DVC hashed.
_REWRITTEN_TEXT = (".dvc/config", ".dvc/config.local")
_REWRITTEN_FOLDERS = ("mlruns", "mlartifacts", ".aiayn")
#: Folders ``copy_project`` never rewrites in: git's objects, DVC's cache and remote (content-addressed).
_LEFT_AS_COPIED = (".git", ".dvc/cache", ".dvc-remote")


def copy_project(src: str | Path, dest: str | Path) -> Path:
    """Copy the folder ``src`` (a scratch project, an MLflow store folder) to ``dest`` (must not exist)
    so that the copy refers to itself only; return ``dest``'s absolute path.

    A test that changes shared state (retrains, registers a version, commits, runs an experiment)
    works on such a copy; the shared original stays as it was built. Absolute paths of ``src`` are
    rewritten to ``dest`` (``file://`` URIs first, then plain paths) in every SQLite database of the
    tree (MLflow stores keep artifact locations as absolute URIs: experiments, runs, logged models,
    model versions), in DVC's config (the ``local`` remote is ``src/.dvc-remote``) and in UTF-8 text
    under ``mlruns/``, ``mlartifacts/`` and ``.aiayn/``. DVC-tracked files are never rewritten, and
    file times are kept, so DVC finds the copy exactly as up to date as the original; DVC's
    own caches outside the project are keyed by absolute path, so for the copy they simply miss.
    Symlinks are copied as links. Raises ``FileExistsError`` if ``dest`` exists.
    """
    src, dest = Path(src).resolve(), Path(dest).resolve()
    if dest.exists():
        raise FileExistsError(f"copy_project: {dest} exists")
    shutil.copytree(src, dest, symlinks=True)
    pairs = [(src.as_uri(), dest.as_uri()), (str(src), str(dest))]
    for path in dest.rglob("*"):
        rel = path.relative_to(dest).as_posix()
        if path.is_symlink() or not path.is_file() or any(rel == f or rel.startswith(f + "/") for f in _LEFT_AS_COPIED):
            continue
        if path.name.endswith(("-wal", "-shm", "-journal")):
            continue  # a database's sidecar: its database is rewritten through SQLite
        if _is_sqlite(path):
            for old, new in pairs:
                _sqlite_replace(path, old, new)
            continue
        if rel not in _REWRITTEN_TEXT and path.relative_to(dest).parts[0] not in _REWRITTEN_FOLDERS:
            continue
        data = path.read_bytes()
        if str(src).encode() not in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary: not rewritten
        stat = path.stat()
        for old, new in pairs:
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return dest
