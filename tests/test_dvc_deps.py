"""DVC sees every code change that can change a stage's output.

For each ``dvc.yaml`` stage whose ``cmd`` runs ``python -m pipelines.run_stage <name>``, the
stage's module (``pipelines.dag.stage_module``: ``aiayn.stages.<name>``, or
``monitoring.reference``) and everything it imports from ``aiayn`` and ``monitoring`` (transitively,
imports inside functions included: read from the source with ``ast``, not from a run) must be
covered by a ``deps`` entry (the file, or a folder above it). The only exceptions are the
modules in ``CANNOT_CHANGE_AN_OUTPUT``, each with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from support.imports import imported_names
from aiayn.config.checks import dvc_params_missing, dvc_problems  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"

#: Modules a stage imports that cannot change what it writes (relative to src/, or to the
#: repository root for ``monitoring``), with why.
CANNOT_CHANGE_AN_OUTPUT = {
    "aiayn/__init__.py": "package marker and version string",
    "aiayn/recording.py": "the recorder a stage is handed and its input checks: what is recorded, never what is "
                          "written under artifacts/",
    "aiayn/io.py": "atomic file writing: how bytes reach the disk, not which bytes",
    "aiayn/retry.py": "which download errors are retried; a retried download is verified by SHA-256",
    "aiayn/stages/__init__.py": "Layout (where files go); the outs themselves are listed in dvc.yaml",
    "aiayn/progress.py": "the progress bar and ETA log lines a stage shows: the terminal and the log, never a file",
    "aiayn/faults.py": "the fault campaign's kill points: inert unless AIAYN_FAULT_POINT arms one (tests); a point "
                       "kills the process, it never changes a byte written",
    "monitoring/__init__.py": "package marker (a docstring)",
    **{f"aiayn/{pkg}/__init__.py": "package marker (a docstring; test_docstring_only_packages)"
       for pkg in ("config", "data", "evaluation", "inference", "export", "serving", "cli")},
}


OURS = ("aiayn", "monitoring")


def _base(path_or_name: Path | str) -> Path:
    """Where a package lives: ``src/`` for ``aiayn``, the repository root for ``monitoring``."""
    if isinstance(path_or_name, Path):
        return SRC if path_or_name.is_relative_to(SRC) else REPO
    return REPO if path_or_name.split(".")[0] == "monitoring" else SRC


def module_file(name: str) -> Path | None:
    """``aiayn.x.y`` -> ``src/aiayn/x/y.py`` or ``src/aiayn/x/y/__init__.py`` (``monitoring.x`` ->
    ``monitoring/x.py``); None if not ours."""
    base = _base(name).joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_files(path: Path) -> set[Path]:
    """``aiayn`` source files ``path`` imports directly (any import statement, at any depth)."""
    package = ".".join(path.relative_to(_base(path)).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.removesuffix(".__init__")
    else:
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for module, name in imported_names(path, package):
        names.add(module)
        if name is not None:
            names.add(f"{module}.{name}")  # `from aiayn import x` imports module x
    files = set()
    for name in names:
        if name.split(".")[0] in OURS:
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # importing a.b.c runs a/b/__init__ too
                if f := module_file(".".join(parts[:i])):
                    files.add(f)
    return files


def closure(start: Path) -> set[Path]:
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(imported_files(f) - seen)
    return seen


def stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


STAGE_CMD = re.compile(r"python -m pipelines\.run_stage (\w+)")


@pytest.mark.parametrize("stage", sorted(stages()))
def test_every_module_a_stage_imports_is_a_dependency(stage):
    spec = stages()[stage]
    match = STAGE_CMD.fullmatch(spec["cmd"].strip())
    assert match, f"stage {stage}: cmd {spec['cmd']!r} is not `python -m pipelines.run_stage <name>`"
    from pipelines.dag import stage_module

    entry = module_file(stage_module(match.group(1)))
    assert entry is not None, f"stage {stage}: no module {stage_module(match.group(1))}"
    deps = [str(d).rstrip("/") for d in spec.get("deps", [])]
    missing = []
    for f in sorted(closure(entry)):
        rel = f.relative_to(REPO).as_posix()  # src/aiayn/... or monitoring/...
        if f.relative_to(_base(f)).as_posix() in CANNOT_CHANGE_AN_OUTPUT:
            continue
        if not any(rel == d or rel.startswith(d + "/") for d in deps):
            missing.append(rel)
    assert not missing, f"dvc.yaml stage {stage!r} imports {missing} but does not list them under deps"


def test_docstring_only_packages():
    """The package markers excused above hold a docstring and nothing else: code there would change outputs
    without DVC seeing it."""
    import ast

    for rel in CANNOT_CHANGE_AN_OUTPUT:
        if "test_docstring_only_packages" in CANNOT_CHANGE_AN_OUTPUT[rel]:
            body = ast.parse((SRC / rel).read_text(encoding="utf-8")).body
            assert [type(n) for n in body] == [ast.Expr], f"{rel} holds more than a docstring"


def test_the_exceptions_are_real_modules():
    for rel in CANNOT_CHANGE_AN_OUTPUT:
        assert (_base(rel.split("/")[0]) / rel).is_file(), rel


def test_closure_sees_imports_inside_functions(tmp_path):
    """The walker is not fooled by a lazy import (a stage importing a module inside ``run``)."""
    train = closure(module_file("aiayn.stages.train"))
    assert SRC / "aiayn" / "config" / "schema.py" in train and SRC / "aiayn" / "model" / "transformer.py" in train


def test_dvcignore_excludes_bytecode():
    text = (REPO / ".dvcignore").read_text(encoding="utf-8")
    assert "__pycache__" in text and "*.pyc" in text


@pytest.mark.parametrize("params_file", ["params.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))])
def test_every_param_a_stage_names_is_in_the_shipped_params_file(params_file):
    """DVC refuses to run a stage whose `params:` entry the params file lacks ("Parameters ... are missing from
    'params.yaml'"), so a param only the scratch projects' resolved files hold would fail `make run` on a fresh
    clone at that stage."""
    missing = dvc_params_missing(yaml.safe_load((REPO / params_file).read_text()), REPO / "dvc.yaml")
    assert not missing, f"{params_file} lacks what dvc.yaml's stages name: {missing}"


def test_aiayn_check_names_the_keys_dvc_would_refuse(tmp_path):
    """A params.yaml without `evaluate.length_norm` and `evaluate.bleu_tokenize`: `dvc repro` would run corpus,
    prepare and tokenize and then refuse the train stage ("Parameters ... are missing from 'params.yaml'"), so
    `aiayn check` names the keys and the stages up front."""
    import subprocess
    import sys

    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    del params["evaluate"]["length_norm"], params["evaluate"]["bleu_tokenize"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    [line] = dvc_problems(tmp_path / "params.yaml", tmp_path)
    assert "evaluate.bleu_tokenize, evaluate.length_norm" in line and "evaluate" in line and "train" in line
    assert dvc_problems(REPO / "params.yaml", REPO) == []
    assert dvc_problems(tmp_path / "params.yaml", tmp_path / "elsewhere") == []  # no dvc.yaml: nothing to say
    out = subprocess.run([sys.executable, "-m", "aiayn.cli.main", "check"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "evaluate.length_norm" in out.stderr, out.stderr
