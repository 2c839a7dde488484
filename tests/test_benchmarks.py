"""benchmarks/: every script is in its index (benchmarks/README.md) with its command, answers ``--help`` from
any directory, and neither benchmarks/ nor tests/ edits the import path by hand.

The ``--help`` check runs every script in ONE fresh interpreter, one after the other (``runpy.run_path`` with
``run_name="__main__"``, as ``python SCRIPT --help`` runs it), started in a temporary directory: the scripts
import what they share as ``benchmarks.*`` (an installed package), not from their own folder or the current one.
One script also runs as a real ``python SCRIPT --help`` process from that directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MAIN_BLOCK = re.compile(r"""^if __name__ == ["']__main__["']:""", re.MULTILINE)
#: A hand-made import path: the list's insert/append/extend, a slice assignment or ``+=``.
PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)\s*\(|\[[^\]]*\]\s*=|\+=)")

#: Runs in a fresh interpreter: ``--help`` of every script given on the command line; prints the failures as JSON.
_HELP_ALL = r"""
import contextlib, io, json, runpy, sys
failed = {}
for script in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(script, run_name="__main__")
        failed[script] = "ran past --help without exiting"
    except SystemExit as e:
        if e.code not in (0, None) or "usage:" not in out.getvalue():
            failed[script] = f"exit {e.code!r}: {out.getvalue()[-1500:]}"
    except BaseException as e:  # noqa: BLE001 - an import or any other error is the finding
        failed[script] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


def python_scripts() -> list[Path]:
    """Every ``*.py`` under benchmarks/ with a ``__main__`` block."""
    return sorted(p for p in BENCH.rglob("*.py") if MAIN_BLOCK.search(p.read_text(encoding="utf-8")))


def shell_scripts() -> list[Path]:
    return sorted(BENCH.rglob("*.sh"))


def test_the_scan_finds_the_scripts():
    names = {p.relative_to(BENCH).as_posix() for p in python_scripts()}
    assert {"perf/train_throughput.py", "studies/variants_study.py", "repro/isa_bytes.py", "gpu/kernel_ptx.py"} <= names
    assert not {"harness.py", "train_steps.py", "local_service.py", "__init__.py"} & names
    assert {p.name for p in shell_scripts()} == {"run_gpu.sh", "same_bytes.sh"}


def test_every_script_is_in_the_index_with_its_command():
    """The README names each script by its path and gives its command line (``python benchmarks/...`` or, for a
    shell script, ``bash benchmarks/...`` / ``benchmarks/...`` with its arguments)."""
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    missing = []
    for script in python_scripts():
        rel = script.relative_to(REPO).as_posix()
        if not re.search(rf"`(\S+=\S+ )*python {re.escape(rel)}( [^`]*)?`", readme):
            missing.append(rel)
    for script in shell_scripts():
        rel = script.relative_to(REPO).as_posix()
        if not re.search(rf"`(\S+=\S+ )*(bash )?{re.escape(rel)}( [^`]*)?`", readme):
            missing.append(rel)
    assert not missing, f"benchmarks/README.md lacks the command of: {missing}"


def test_every_script_answers_help_from_another_directory(tmp_path):
    scripts = [str(p) for p in python_scripts()]
    proc = subprocess.run([sys.executable, "-c", _HELP_ALL, *scripts], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"{Path(k).relative_to(REPO)}: {v}" for k, v in failed.items())
    # and one as its own process: the script's folder first on sys.path, the package found all the same
    one = subprocess.run([sys.executable, str(BENCH / "perf" / "train_loop.py"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and "usage:" in one.stdout, one.stderr[-3000:]


def test_no_hand_made_import_path_in_benchmarks_or_tests():
    hits = [f"{p.relative_to(REPO)}:{n}" for root in (BENCH, REPO / "tests") for p in sorted(root.rglob("*"))
            if p.suffix in (".py", ".sh") and p.is_file()
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if PATH_EDIT.search(line)]
    assert not hits, f"sys.path edited by hand (import benchmarks.* / support.* instead): {hits}"


def test_the_path_scan_sees_each_kind_of_edit():
    path = "sys" + ".path"  # spelt apart: the scan above reads this file too
    assert all(PATH_EDIT.search(path + edit) for edit in (".insert(0, 'tests')", ".append(x)", "[:0] = [a]", " += [a]"))
    assert not any(PATH_EDIT.search(line) for line in (f"print({path})", f"x = list({path})"))
