"""The suite's one strict switch: ``AIAYN_TEST_STRICT=1`` (``.ci/run`` sets it) turns every skip into a
failure, except a skip that depends on the host class.

A skip says "this test did not run here". On a developer's machine that is often fine (no PostgreSQL,
no Compose binary); in CI it hides a test that must run. Under the switch ``tests/conftest.py``'s
``pytest_runtest_makereport`` / ``pytest_make_collect_report`` hooks rewrite every skipped report
(``pytest.skip``, a ``skipif`` mark, a module-level skip; setup or call phase) into a failure that
quotes the skip's reason, with one exception: a skip made with ``host_class_skip`` or
``host_class_skipif``, for a test that cannot run on this class of host (the CPU's instruction set, no
CUDA GPU). No environment can fix those, so they stay skips, and ``pytest_terminal_summary`` lists them
in a section of their own ("skipped for this host class") on every run, so they are never silent.

Every other skip is an environment skip (a missing program, a missing file, a setting): it fails under
the switch. ``xfail`` outcomes are not skips and are left alone.

A pytest plugin (``tests/conftest.py`` loads it with ``pytest_plugins``; ``pytest -p support.strict``
elsewhere), not a test module. The switch is the tests' own, read here and nowhere in the product
(``aiayn.config.settings`` holds the product's ``AIAYN_*`` variables only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

#: ``1``: a skip fails the test (host-class skips excepted).
STRICT_ENV = "AIAYN_TEST_STRICT"
#: Every host-class skip reason starts with this; nothing else may.
HOST_CLASS_PREFIX = "host class: "
#: The terminal summary's section listing host-class skips.
SUMMARY_TITLE = "skipped for this host class"


def strict(environ: Mapping[str, str] | None = None) -> bool:
    """The switch: ``AIAYN_TEST_STRICT`` is ``1`` in ``environ`` (default ``os.environ``)."""
    return (os.environ if environ is None else environ).get(STRICT_ENV, "").strip() == "1"


def host_class_skip(reason: str) -> NoReturn:
    """Skip the running test because this host's class cannot run it (an instruction set the CPU lacks,
    no CUDA GPU); stays a skip under ``AIAYN_TEST_STRICT=1`` and is listed in the terminal summary."""
    __tracebackhide__ = True  # the skip's location: the caller's line
    pytest.skip(HOST_CLASS_PREFIX + reason)


def host_class_skipif(condition: bool, reason: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark whose skip is a host-class skip (see ``host_class_skip``)."""
    return pytest.mark.skipif(condition, reason=HOST_CLASS_PREFIX + reason)


def skip_reason(report) -> str | None:
    """The reason of a skipped report (``pytest.skip``'s message without pytest's ``Skipped: ``), or None
    when the report is not a skip (an ``xfail`` outcome is not one)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message.removeprefix("Skipped: ")


def is_host_class(reason: str | None) -> bool:
    return reason is not None and reason.startswith(HOST_CLASS_PREFIX)


def enforce(report) -> None:
    """Under the switch, make a skipped ``report`` (test or collection) that is not a host-class skip a
    failure naming the switch and the reason; otherwise leave it as it is."""
    reason = skip_reason(report)
    if reason is None or is_host_class(reason) or not strict():
        return
    where = f"{report.longrepr[0]}:{report.longrepr[1]}: " if isinstance(report.longrepr, tuple) else ""
    report.outcome = "failed"
    report.longrepr = (f"{where}skipped under {STRICT_ENV}=1, where every test must run (only a host-class "
                       f"skip, tests/support/strict.py, may stay a skip): {reason}")


# --------------------------------------------------------------------------- the plugin's hooks


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Setup, call and teardown reports of every test (``skipif`` marks skip in setup)."""
    report = yield
    enforce(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped while collected (``pytest.skip(..., allow_module_level=True)``, ``importorskip``)."""
    report = yield
    enforce(report)
    return report


def pytest_report_header(config):
    if strict():
        return f"{STRICT_ENV}=1: a skip fails the test, except a host-class skip (tests/support/strict.py)"
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Every host-class skip, with its reason, in a section of its own: a run says which tests this host
    could not run, whether or not the switch is on."""
    skipped = [(r.nodeid, reason) for r in terminalreporter.stats.get("skipped", [])
               if is_host_class(reason := skip_reason(r))]
    if not skipped:
        return
    terminalreporter.section(SUMMARY_TITLE, yellow=True, bold=True)
    for nodeid, reason in skipped:
        terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")
