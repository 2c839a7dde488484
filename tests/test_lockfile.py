"""requirements.lock is closed: `make install` (pip --no-deps) installs everything every locked
package needs, on every Python the project accepts (``requires-python``: any 3.11.x).

A dependency that only applies to some interpreters (a marker such as
``python_full_version < "3.11.3"``) is invisible on the interpreter the lock was frozen on:
redis needs ``async-timeout`` on Debian 12's Python 3.11.2 but not on 3.11.7, and a fresh
``make run`` on Debian's Python failed at import. This test evaluates every installed locked
package's requirements under several 3.11 micro versions and fails on one the lock misses.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

#: Python versions `requires-python` admits that differ in markers seen in practice.
PYTHONS = ("3.11.0", "3.11.2", "3.11.7", "3.11.14")

#: Requirements the CPU build of torch declares for its CUDA wheels; the CPU wheel never loads them.
NOT_NEEDED = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")


def makefile_pins() -> set[str]:
    """Packages `make install` pins itself before the lock (``pip install ... pip==X setuptools==Y``)."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {canonicalize_name(n) for n in re.findall(r"\b(pip|setuptools)==[0-9.]+", text)}


def lock_requirements() -> list[Requirement]:
    """Every requirement line of requirements.lock (comments stripped)."""
    reqs = []
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            reqs.append(Requirement(line))
    return reqs


def locked() -> set[str]:
    """Canonical names of every locked package, plus the Makefile's own pins."""
    return makefile_pins() | {canonicalize_name(r.name) for r in lock_requirements()}


def test_makefile_pins_pip_and_setuptools() -> None:
    assert makefile_pins() == {"pip", "setuptools"}


def test_lock_lines_are_exact_pins() -> None:
    for req in lock_requirements():
        spec = str(req.specifier)
        assert spec.startswith("==") and "," not in spec, f"not an exact pin: {req}"


@pytest.mark.parametrize("python", PYTHONS)
def test_lock_is_closed_on_every_python_311(python: str) -> None:
    lock = locked()
    env = default_environment() | {"python_full_version": python, "python_version": python.rsplit(".", 1)[0]}
    missing = []
    for name in lock:
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # a marker-only line not installed on this interpreter
        for raw in requires:
            req = Requirement(raw)
            dep = canonicalize_name(req.name)
            if NOT_NEEDED.match(dep):
                continue
            if req.marker is not None and not req.marker.evaluate(env | {"extra": ""}):
                continue  # an optional extra, or a marker false on this Python
            if dep not in lock:
                missing.append(f"{name} needs {raw!r}")
    assert not missing, f"requirements.lock lacks, on Python {python}: {missing}"


def test_torch_is_the_cpu_build_from_its_index() -> None:
    """PyPI's ``torch`` is the CUDA build; installed with ``--no-deps`` it fails at import for lack of its
    CUDA libraries. The lock pins the ``+cpu`` build and ``make install`` passes PyTorch's CPU index."""
    torch = next(r for r in lock_requirements() if r.name == "torch")
    assert str(torch.specifier).endswith("+cpu"), torch
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "TORCH_INDEX ?= https://download.pytorch.org/whl/cpu" in makefile
    # torch alone from that index (an unreachable extra index would slow every other package's lookup)
    assert """--extra-index-url $(TORCH_INDEX) "$$(grep -o '^torch==[^ ]*' requirements.lock)\"""" in makefile
