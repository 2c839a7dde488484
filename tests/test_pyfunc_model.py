"""The saved MLflow pyfunc model on its own: it loads and translates in an interpreter where the only ``aiayn``
is the copy it carries, its requirements.txt brings what that code imports, and MLflow does not warn about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import tiny  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402
from aiayn.inference.load import BundlePredictor  # noqa: E402

OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.0, max_len_b=6)


#: Loads the saved pyfunc in a fresh interpreter where the only importable ``aiayn`` is the model's own copy
#: (any installed one, editable or not, is refused), translates, and lists the modules it imported.
_LOAD_ALONE = r"""
import importlib.machinery, json, sys
MODEL = sys.argv[1]

class OnlyTheModelsAiayn:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] != "aiayn":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not str(spec.origin).startswith(MODEL):
            raise ModuleNotFoundError(f"No module named {name!r} in the model", name=name)
        return spec

sys.meta_path.insert(0, OnlyTheModelsAiayn)
import mlflow.pyfunc
out = list(mlflow.pyfunc.load_model(MODEL).predict(json.loads(sys.argv[2])))
mods = dict(sys.modules)
print(json.dumps({"out": out, "aiayn": mods["aiayn"].__file__, "tops": sorted({m.split(".")[0] for m in mods}),
                  "aiayn_files": sorted(m.__file__ for n, m in mods.items() if n.split(".")[0] == "aiayn")}))
"""


def _imported_names(files):
    """Top-level module names the ``import`` statements of ``files`` name (absolute imports only)."""
    import ast

    names = set()
    for f in files:
        for node in ast.walk(ast.parse(Path(f).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _with_dependencies(names):
    """Canonical names of ``names`` and every distribution they require, transitively (no extras)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [r.name for r in map(Requirement, requires(name) or []) if r.marker is None
                     or r.marker.evaluate({"extra": ""})]
        except PackageNotFoundError:
            pass
    return seen


def test_the_saved_pyfunc_loads_where_aiayn_is_not_installed(tmp_path):
    """The logged model's requirements.txt must build an environment that loads it, although its code file
    imports aiayn (not on PyPI): the model carries the aiayn package (MLflow ``code_paths``), and every
    distribution aiayn's code imports while loading and predicting is in its requirements.txt or required by
    one there. Without ``code_paths`` it fails with ``No module named 'aiayn'``."""
    import os
    import subprocess
    import sys
    import warnings
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from aiayn.tracking.registry import save_translation_pyfunc

    bundle = tiny.serving_bundle(tmp_path, OPTIONS)
    src = tiny.corpus(12, 3)[0][:3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        local = save_translation_pyfunc(bundle, tmp_path / "pyfunc", example=src, predictor=BundlePredictor)
    assert not [w for w in caught if "type hint" in str(w.message)]  # MLflow's "Add type hints" warning, at save
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", _LOAD_ALONE, str(local), json.dumps(src)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["out"] == BundlePredictor(bundle).translator.translate(src, OPTIONS)
    assert got["aiayn"].startswith(str(local / "code" / "aiayn"))
    assert "type hint" not in run.stderr  # ...and at load
    reqs = [Requirement(line) for line in (local / "requirements.txt").read_text().split() if line]
    # pinned to what saved it, as public versions pip finds on PyPI (not torch's local `+cpu`)
    assert all(str(r.specifier).startswith("==") and "+" not in str(r.specifier) for r in reqs), reqs
    assert {canonicalize_name(r.name) for r in reqs} >= {"torch", "ctranslate2", "mlflow"}
    # what aiayn's own code imported while loading and predicting (mlflow's optional imports are its own)
    ours = set(got["tops"]) & _imported_names(got["aiayn_files"]) - set(sys.stdlib_module_names) - {"aiayn"}
    dists = packages_distributions()
    needed = {canonicalize_name(d) for top in ours for d in dists.get(top, [top])}
    assert {"torch", "ctranslate2", "sentencepiece"} <= needed  # the check sees the imports it is about
    missing = needed - _with_dependencies([r.name for r in reqs])
    assert not missing, f"aiayn imported these, which requirements.txt does not bring: {missing}"
