"""No import cycle among our modules (``src/aiayn``, ``pipelines``, ``monitoring``), read from the source with ``ast``.

Every import statement is an edge, at any depth: a lazy import inside a function still ties
the two modules together (two modules that each import the other inside a function are a
cycle). An edge goes to the most specific module the statement names (``from aiayn.x import y``:
``aiayn.x.y`` when that is a module, else ``aiayn.x``). The implicit import of parent packages is not an edge: a package's
``__init__`` re-exporting its submodules, which import each other by full name, is the
ordinary layout and Python resolves it; a submodule that takes a *name* from its package's
``__init__`` is an edge to it, and a cycle when that ``__init__`` imports the submodule.
"""

from __future__ import annotations

from pathlib import Path

from support.imports import imported_names

REPO = Path(__file__).resolve().parents[1]

#: Where each top-level package of ours lives (the folder holding it).
ROOTS = {"aiayn": REPO / "src", "pipelines": REPO, "monitoring": REPO}


def modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of the packages in ``roots``."""
    found = {}
    for package, base in roots.items():
        for path in sorted((base / package).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, at any depth of its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for module, imported in imported_names(path, package):
        full = f"{module}.{imported}"
        targets.add(full if imported is not None and full in known else module)
    edges = set()
    for target in targets:
        while target and target not in known:  # `import aiayn.x.Name`-like spellings: the module above
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    known = modules(roots)
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycle_in_the_codebase():
    graph = import_graph(ROOTS)
    assert "aiayn.stages.train" in graph and "aiayn.train.trainer" in graph  # the walk sees the codebase
    found = cycles(graph)
    assert not found, "import cycles (each line: modules that import each other, directly or not):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return {"pkg": tmp_path}


def test_a_lazy_import_closing_a_loop_is_a_cycle(tmp_path):
    """A cycle closed lazily: a imports b at the top, b imports a name of a inside a function."""
    roots = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import helper\n",
        "pkg/b.py": "def helper():\n    from pkg.a import thing\n    return thing\n",
        "pkg/c.py": "from . import a\n",  # relative, outside the loop
    })
    graph = import_graph(roots)
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_a_package_reexporting_its_submodules_is_not_a_cycle_but_taking_a_name_from_it_is(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg.core import run\nfrom pkg.util import helper\n",
        "pkg/core.py": "from pkg.util import helper\nimport pkg.util\n",
        "pkg/util.py": "import os\n",
    }
    assert cycles(import_graph(_package(tmp_path / "ok", files))) == []
    files["pkg/util.py"] = "from pkg import run\n"  # a name defined in pkg/__init__ (re-exported from core)
    assert cycles(import_graph(_package(tmp_path / "bad", files))) == [["pkg", "pkg.core", "pkg.util"]]
