"""The house's architecture, read from the source with ``ast`` (imports inside functions included):
MLflow only in ``aiayn.tracking``, a core that reaches for no orchestrator, a monitor without Prefect,
every ``AIAYN_*`` variable named in ``aiayn.config.settings`` only, one concept per module name, and
units one person can hold (module and function sizes). Cycles: tests/test_import_graph.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
TRACKING = SRC / "aiayn" / "tracking"
SCANNED = (SRC / "aiayn", REPO / "pipelines", REPO / "monitoring")


def imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (every import statement, at any depth)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def importers(roots: tuple[Path, ...], top: str) -> dict[Path, list[str]]:
    """``{file: [modules]}`` for the files under ``roots`` that import ``top`` (or a submodule of it)."""
    hits = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            mods = sorted(m for m in imports(path) if m == top or m.startswith(top + "."))
            if mods:
                hits[path] = mods
    return hits


def test_the_scanner_sees_lazy_and_aliased_imports(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    import mlflow.pyfunc as p\n    from mlflow import MlflowClient\n")
    (tmp_path / "clean.py").write_text("import mlflow_like\nx = 'import mlflow'\n")
    assert imports(tmp_path / "m.py") == {"mlflow.pyfunc", "mlflow"}
    assert importers((tmp_path,), "mlflow") == {tmp_path / "m.py": ["mlflow", "mlflow.pyfunc"]}


def test_only_the_tracking_package_imports_mlflow():
    hits = importers(SCANNED, "mlflow")
    outside = [f"{f.relative_to(REPO)}: {m}" for f, m in hits.items() if not f.is_relative_to(TRACKING)]
    assert not outside, f"mlflow imported outside src/aiayn/tracking/: {outside}"
    assert hits, "the tracking package imports mlflow: the scan must find it"


@pytest.mark.parametrize("top", ["prefect", "dvc", "pipelines", "monitoring"])
def test_the_core_imports_no_orchestration(top):
    assert not importers((SRC / "aiayn",), top), f"src/aiayn imports {top}"


@pytest.mark.parametrize("top", ["prefect", "pipelines"])
def test_the_monitor_imports_no_orchestrator(top):
    assert not importers((REPO / "monitoring",), top), f"monitoring imports {top}"


@pytest.mark.parametrize("module", ["aiayn.stages", "aiayn.export.bundle", "aiayn.cli.main", "pipelines", "monitoring"])
def test_tracking_is_told_its_policy(module):
    """Tracking knows no pipeline: it is handed each stage's StageRecord."""
    assert not importers((TRACKING,), module), f"aiayn.tracking imports {module}"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_every_aiayn_variable_is_named_in_settings_only():
    import re

    name = re.compile(r"^AIAYN_[A-Z0-9_]+$")
    found = [f"{path.relative_to(REPO)}:{line}: {value}" for root in SCANNED for path in sorted(root.rglob("*.py"))
             if path != SRC / "aiayn" / "config" / "settings.py"
             for line, value in _code_strings(path) if name.match(value)]
    assert not found, f"AIAYN_* variables named outside aiayn.config.settings: {found}"
    from aiayn.config import settings

    declared = {v for k, v in vars(settings).items() if k.endswith("_ENV")}
    assert {"AIAYN_TRACKING", "AIAYN_PARENT_RUN_ID", "AIAYN_DATA_MIRROR", "AIAYN_REGISTERED_MODEL"} <= declared



def _module_names(roots: tuple[Path, ...], base: Path = REPO) -> dict[str, list[str]]:
    """File name -> the files that carry it, for every module under ``roots`` (package markers aside)."""
    names: dict[str, list[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                names.setdefault(path.name, []).append(path.relative_to(base).as_posix())
    return names


def test_the_name_scan_sees_a_repeated_name(tmp_path):
    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "drift.py").write_text("")
        (tmp_path / folder / "__init__.py").write_text("")
    names = {k: v for k, v in _module_names((tmp_path,), tmp_path).items() if len(v) > 1}
    assert list(names) == ["drift.py"]


def test_no_two_modules_share_a_file_name():
    """A module name says one concept: no file name twice under src/, pipelines/ and monitoring/."""
    repeated = {name: files for name, files in _module_names(SCANNED).items() if len(files) > 1}
    assert not repeated, f"module names used for more than one file: {repeated}"


# ---------------------------------------------------------------- sizes: one person can hold a unit

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 700
#: Modules allowed past MAX_MODULE_LINES, with the reason (a closing note repeats it). None now: the
#: Triton kernels (kernels/flash_kernels.py, forward and backward side by side) left the launcher and
#: autograd Function (kernels/flash_attention.py), which held them past 700 lines.
LONG_MODULES: dict[str, int] = {}
#: The size rule covers the tests and the benchmarks too (the layering rules above: SCANNED only).
SIZE_SCANNED = (*SCANNED, REPO / "tests", REPO / "benchmarks")


def sizes(roots: tuple[Path, ...], base: Path = REPO) -> tuple[dict[str, int], dict[str, int]]:
    """``(modules, functions)``: line counts of every ``.py`` file under ``roots`` and of every
    function or method in them (``file:qualname``, paths relative to ``base``; decorators excluded,
    docstring included)."""
    modules, functions = {}, {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(base))
            modules[rel] = len(text.splitlines())

            def walk(node, prefix=""):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        name = f"{prefix}{child.name}"
                        if not isinstance(child, ast.ClassDef):
                            functions[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
                        walk(child, name + ".")
                    else:
                        walk(child, prefix)

            walk(ast.parse(text))
    return modules, functions


def test_the_size_scan_counts_nested_functions_and_methods(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("class A:\n    def f(self):\n        def g():\n            return 1\n        return g\n")
    modules, functions = sizes((pkg,), base=tmp_path)
    assert modules == {"pkg/m.py": 5} and functions == {"pkg/m.py:A.f": 4, "pkg/m.py:A.f.g": 2}


def test_no_function_over_80_lines_and_no_module_over_700():
    modules, functions = sizes(SIZE_SCANNED)
    long_functions = {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    long_modules = {m: n for m, n in modules.items() if n > LONG_MODULES.get(m, MAX_MODULE_LINES)}
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines (or their stated limit): {long_modules}"
    assert len(functions) > 500 and max(functions.values()) > 40, "the scan must see the code base's functions"
    assert {"tests", "benchmarks"} <= {f.split("/", 1)[0] for f in functions}, "the scan must see tests/ and benchmarks/"


def compile_warnings(roots) -> dict[str, list[str]]:
    """``{file: [warning, ...]}`` for the Python files under ``roots`` whose compilation warns (an invalid
    escape such as ``"\\ "`` in a non-raw string: a DeprecationWarning on 3.11, a SyntaxWarning on 3.12, an
    error in a later Python)."""
    import warnings

    found = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compile(path.read_text(encoding="utf-8"), str(path), "exec")
            if caught:
                found[str(path)] = [f"line {w.lineno}: {w.message}" for w in caught]
    return found


def test_the_scan_for_compile_warnings_sees_an_invalid_escape(tmp_path):
    (tmp_path / "m.py").write_text('"""a ``reserve``\\ s b"""\nX = 1\n')
    assert list(compile_warnings((tmp_path,))) == [str(tmp_path / "m.py")]


def test_every_file_compiles_without_a_warning():
    found = compile_warnings(SIZE_SCANNED)
    assert not found, f"files whose compilation warns (invalid escapes turn into errors in later Pythons): {found}"
