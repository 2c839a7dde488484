"""Test-wide environment, shared fixtures and how the suite splits over two processes.

- environment: the Triton interpreter on CPU, telemetry off, one PREFECT_HOME per process;
- the strict switch (``support.strict``): under ``AIAYN_TEST_STRICT=1`` every skip fails, except a
  host-class skip (CPU instruction set, no GPU), which the terminal summary lists;
- ``multi30k_mirror``, ``one_thread``, ``prefect_harness`` (one temporary Prefect API per process);
- ``smoke_pipeline``: the smoke configuration's whole pipeline, built ONCE per run through the
  ``pipeline`` flow and shared by every test that checks a finished pipeline
  (``test_dvc_pipeline``, ``test_pipelines``);
- ``pytest -n 2`` (pytest-xdist, ``make test``): ``pytest_xdist_make_scheduler`` runs each module
  in one process (module-scoped fixtures are built once), the modules sharing ``smoke_pipeline``
  in one group, and the services tier (real PostgreSQL, MLflow and Prefect servers, a browser)
  in one group that runs its modules one after the other; the heaviest groups are queued first.
"""

import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

# Must be set before any @triton.jit runs: the interpreter on CPU-only machines, compiled kernels on CUDA.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
# What every aiayn process sets where it starts, before its first torch op (OMP_WAIT_POLICY, and
# ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX2): the stage processes the tests start compute as they do.
from aiayn.config.settings import apply_process_defaults  # noqa: E402

apply_process_defaults()
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # Hugging Face folders are read from disk only, never the hub
if "PREFECT_HOME" not in os.environ:  # before Prefect is imported; removed when the process ends
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="aiayn-prefect-home-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)

import pytest  # noqa: E402

#: ``AIAYN_TEST_STRICT=1`` (``.ci/run``): a skip fails its test unless it is a host-class skip
#: (``support.strict.host_class_skip``), which the terminal summary lists.
pytest_plugins = ["support.strict"]

# Tests use tiny tensors: one intra-op thread avoids OpenMP spin-wait oversubscription when
# several test processes (or helpers) share the 2 cores, and is faster for such sizes anyway.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MIRROR = REPO_ROOT.parent / "shared" / "data" / "multi30k"
SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
BIN = Path(sys.executable).parent

#: Process groups under xdist: modules that share one session fixture, or must not run beside each
#: other, run in one process, one after the other.
SHARED_GROUPS = {"test_dvc_pipeline": "smoke-pipeline", "test_pipelines": "smoke-pipeline",
                 "test_hf_marian": "smoke-pipeline", "test_fault_campaign": "smoke-pipeline",
                 "test_real_services": "services", "test_prefect_services": "services",
                 "test_serving_services": "services"}
#: Groups to queue first (longest first, seconds on a 2-core host): the two processes then end together.
HEAVY_FIRST = ("smoke-pipeline", "services", "test_training_budget", "test_distributed", "test_train", "test_monitoring",
               "test_translate", "test_serve", "test_variants_study", "test_tracking", "test_flash_attention")


def _group(nodeid: str) -> str:
    """The process group of a test: its module, or the shared group ``SHARED_GROUPS`` names."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED_GROUPS.get(module, module)


#: pytest-timeout's bound (s) for a slow test that reads the Multi30k mirror: it runs a whole pipeline on
#: the real corpus, in its body or in a fixture's setup (``smoke_pipeline``, billed to whichever test of
#: its group asks first, in pytest-randomly's order). One smoke pipeline took 378 s in the nightly
#: deployment test (a CI host); the slowest host is ~2x slower (~760 s); x3 = ~2,300 s. It covers the
#: tests' own bounds: test_real_services' pipeline (1,500 s) and server starts (3 x 180 s). Every other
#: test: ``timeout`` in pyproject.toml. A ``timeout`` mark on the test itself wins.
PIPELINE_TIMEOUT_S = 2400


def pytest_collection_modifyitems(config, items):
    """Heaviest groups first (``HEAVY_FIRST``), so the two processes finish together; file order kept
    within a group (stable sort). A slow test on the Multi30k mirror gets ``PIPELINE_TIMEOUT_S``."""
    rank = {g: i for i, g in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))
    for item in items:
        if (item.get_closest_marker("slow") and "multi30k_mirror" in item.fixturenames
                and item.get_closest_marker("timeout") is None):
            item.add_marker(pytest.mark.timeout(PIPELINE_TIMEOUT_S))


def pytest_xdist_make_scheduler(config, log):
    """``-n N``: every test of one group runs in one process, in collection order (xdist's own
    ``--dist loadgroup`` reads ``xdist_group`` marks into node ids, which pytest 9 no longer lets a
    plugin rewrite, so the groups are given to xdist's scope scheduler here)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return GroupScheduling(config, log)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny ops, restored after it (a test elsewhere may set
    more): OpenMP spinning across processes on a shared 2-core box costs 100x.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def multi30k_mirror() -> Path:
    """The local Multi30k mirror (``AIAYN_DATA_MIRROR`` or ``../shared/data/multi30k``)."""
    path = Path(os.environ.get("AIAYN_DATA_MIRROR", DEFAULT_MIRROR))
    if not (path / "SHA256SUMS").exists():
        message = (f"no Multi30k mirror at {path} (SHA256SUMS missing): set AIAYN_DATA_MIRROR to a folder "
                   "holding the corpus files, e.g. ../shared/data/multi30k")
        pytest.skip(message)  # an environment skip: a failure under AIAYN_TEST_STRICT=1 (CI)
    return path


@pytest.fixture(scope="session")
def prefect_harness() -> str:
    """One temporary Prefect API (SQLite in this process's PREFECT_HOME) for every flow of the
    process; yields its URL, so subprocesses (``dvc repro`` stages) report to it too."""
    from prefect.settings import get_current_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(get_current_settings().api.url).rstrip("/")


@pytest.fixture(scope="session")
def smoke_pipeline(tmp_path_factory, prefect_harness, multi30k_mirror) -> dict:
    """The smoke configuration's whole pipeline, run once: a scratch project (git + DVC, its own
    MLflow store and DVC remote) on ``configs/smoke.yaml`` through the ``pipeline`` flow (fetch from
    the mirror -> ``dvc repro`` of every stage -> ``dvc push`` -> report).

    Returns ``{"root", "env", "state", "result", "seconds"}``; ``env`` is what ``dvc``/``aiayn``
    subprocesses of the tests need (the venv first on PATH, the mirror, this process's Prefect API,
    one thread per stage). Tests that change the project (forced reruns, an experiment, an edit)
    leave it as reproducible and up to date as they found it.
    """
    from pipelines.pipeline import pipeline
    from support.scratch import scratch_project

    root = scratch_project(tmp_path_factory.mktemp("smoke-pipeline") / "project", SMOKE, git=True)
    env = os.environ | {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "AIAYN_DATA_MIRROR": str(multi30k_mirror),
        "PREFECT_API_URL": prefect_harness,
        "DVC_NO_ANALYTICS": "1",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": "1",
    }
    for name in ("MLFLOW_TRACKING_URI", "AIAYN_PARENT_RUN_ID"):
        env.pop(name, None)
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # the stage processes DVC starts: one core each
        for name in ("MLFLOW_TRACKING_URI", "AIAYN_PARENT_RUN_ID"):
            mp.delenv(name, raising=False)
        state = pipeline(root=str(root), mirror=str(multi30k_mirror), return_state=True)
    seconds = time.perf_counter() - t0
    assert state.is_completed(), state.message
    return {"root": root, "env": env, "state": state, "result": state.result(), "seconds": seconds}


def _tier(report) -> str:
    keywords = getattr(report, "keywords", {})
    return ("services" if "services" in keywords else "faults" if "faults" in keywords
            else "heavy" if "heavy" in keywords else "slow" if "slow" in keywords else "unit")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Per tier (unit, slow, heavy, faults, services): tests, failures and the summed test time (setup + call +
    teardown; with ``-n 2`` two tests run at once, so the sums exceed the wall time), and the
    host line (``aiayn.host``), so a slow or failing run says where its time went."""
    seconds: dict[str, float] = {}
    tests: dict[str, set] = {}
    failed: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not hasattr(report, "when") or not hasattr(report, "duration"):
                continue
            tier = _tier(report)
            seconds[tier] = seconds.get(tier, 0.0) + report.duration
            tests.setdefault(tier, set()).add(report.nodeid)
            failed[tier] = failed.get(tier, 0) + (report.failed and report.when == "call")
    if not seconds:
        return
    from aiayn.host import host_info

    terminalreporter.section("time per tier")
    for tier in ("unit", "slow", "heavy", "faults", "services"):
        if tier in seconds:
            terminalreporter.write_line(f"{tier:9s} {len(tests[tier]):4d} tests {failed.get(tier, 0):3d} failed "
                                        f"{seconds[tier]:8.1f} s summed")
    terminalreporter.write_line(host_info().line())
