"""The suite's strict switch (``tests/support/strict.py``): under ``AIAYN_TEST_STRICT=1`` a skip fails
its test, except a host-class skip, which stays a skip and is listed in the terminal summary. Each case
runs a small test file in an inner pytest (``pytester``) with and without the switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from support.strict import HOST_CLASS_PREFIX, STRICT_ENV, SUMMARY_TITLE, strict

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

ENVIRONMENT_SKIPS = {
    "call": """
import pytest

def test_it():
    pytest.skip("no such program here")
""",
    "mark": """
import pytest

@pytest.mark.skipif(True, reason="no such program here")
def test_it():
    pass
""",
    "fixture": """
import pytest

@pytest.fixture
def program():
    pytest.skip("no such program here")

def test_it(program):
    pass
""",
    "module": """
import pytest

pytest.skip("no such program here", allow_module_level=True)

def test_it():
    pass
""",
    "services.require": """
from support.services import require

def test_it():
    require("aiayn-no-such-program", hint="no such program here")
""",
}

HOST_CLASS_SKIPS = """
import pytest
from support.strict import host_class_skip, host_class_skipif

def test_call():
    host_class_skip("this CPU has no AVX-512")

@host_class_skipif(True, "no CUDA GPU")
def test_mark():
    pass

def test_runs():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, *, on: bool) -> pytest.RunResult:
    if on:
        monkeypatch.setenv(STRICT_ENV, "1")
    else:
        monkeypatch.delenv(STRICT_ENV, raising=False)
    pytester.makepyfile(test_inner=source)
    return pytester.runpytest("-p", "support.strict", "-p", "no:randomly", "-p", "no:cacheprovider", "-rA")


@pytest.mark.parametrize("kind", sorted(ENVIRONMENT_SKIPS))
def test_an_environment_skip_fails_under_the_switch_and_skips_without_it(pytester, monkeypatch, kind):
    result = _run(pytester, monkeypatch, ENVIRONMENT_SKIPS[kind], on=False)
    result.assert_outcomes(skipped=1)
    result = _run(pytester, monkeypatch, ENVIRONMENT_SKIPS[kind], on=True)
    outcomes = result.parseoutcomes()
    assert "skipped" not in outcomes and "passed" not in outcomes, result.stdout.str()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1, outcomes  # setup/collection: an error
    result.stdout.fnmatch_lines([f"*skipped under {STRICT_ENV}=1*no such program here*"])
    assert result.ret != 0


@pytest.mark.parametrize("on", [False, True])
def test_a_host_class_skip_stays_a_skip_and_is_listed(pytester, monkeypatch, on):
    result = _run(pytester, monkeypatch, HOST_CLASS_SKIPS, on=on)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*{SUMMARY_TITLE}*",
                                 f"SKIPPED test_inner.py::test_call: {HOST_CLASS_PREFIX}this CPU has no AVX-512",
                                 f"SKIPPED test_inner.py::test_mark: {HOST_CLASS_PREFIX}no CUDA GPU"])


def test_xfail_is_not_a_skip(pytester, monkeypatch):
    source = """
import pytest

@pytest.mark.xfail(reason="known", strict=True)
def test_it():
    assert False
"""
    _run(pytester, monkeypatch, source, on=True).assert_outcomes(xfailed=1)


def test_nothing_is_listed_when_nothing_is_host_class(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, "def test_it():\n    pass\n", on=True)
    result.assert_outcomes(passed=1)
    assert SUMMARY_TITLE not in result.stdout.str()


def test_the_switch_reads_one_value():
    assert strict({STRICT_ENV: "1"}) and strict({STRICT_ENV: " 1 "})
    assert not strict({}) and not strict({STRICT_ENV: "0"}) and not strict({STRICT_ENV: ""})


def test_the_suite_runs_under_the_plugin(request):
    assert request.config.pluginmanager.has_plugin("support.strict")


def test_ci_sets_the_switch():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"^export {STRICT_ENV}=1$", ci, re.M), "CI must run every test it can (.ci/run)"
    assert "AIAYN_REQUIRE_SERVICES" not in ci


def test_importorskip_only_for_optional_packages():
    """A locked package (requirements.lock) is required: its tests import it plainly and fail without it.
    ``pytest.importorskip`` is for a package the lock does not hold, and says why it is optional."""
    locked = {canonicalize_name(line.split("==")[0]) for line in (REPO / "requirements.lock").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    pattern = re.compile(r"importorskip\(\s*[\"']([\w.]+)[\"']")
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if m := pattern.search(line):
                top = m.group(1).split(".")[0]
                if top == "aiayn" or canonicalize_name(top) in locked or "optional" not in line.partition("#")[2]:
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, f"importorskip of a required module, or without an '# optional: why' comment: {found}"


def test_every_test_has_a_time_limit(request):
    """pytest-timeout (pyproject.toml): a hung test fails with its stack instead of holding the run."""
    assert float(request.config.getini("timeout")) > 0 and request.config.getini("timeout_method") == "signal"
    assert request.config.pluginmanager.has_plugin("timeout")
