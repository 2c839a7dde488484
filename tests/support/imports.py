"""What a Python source file imports, read with ``ast`` (never by importing it): the one scanner behind
the tests that derive DVC deps (``test_dvc_deps``) and the import graph (``test_import_graph``)."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_names(path: Path, package: str) -> set[tuple[str, str | None]]:
    """``(module, name)`` for every import statement in ``path``, at any depth (lazy imports inside
    functions included): ``import a.b`` gives ``("a.b", None)``, ``from a.b import c`` gives
    ``("a.b", "c")``, a relative import resolved against ``package`` (the package the file is in:
    the file's own dotted name for an ``__init__.py``). ``c`` may be a submodule or a name; each
    caller decides which."""
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.update((base, a.name) for a in node.names)
    return found
