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
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["PROJECT_ROOT", "resolved_params_yaml", "scratch_project"]

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
