"""Test-wide environment: Triton interpreter, offline telemetry, corpus mirror."""

import os
from pathlib import Path

import torch

# Must be set before any @triton.jit runs: the interpreter on CPU-only machines, compiled kernels on CUDA.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

import pytest  # noqa: E402

# Tests use tiny tensors: one intra-op thread avoids OpenMP spin-wait oversubscription when
# several test processes (or helpers) share the 2 cores, and is faster for such sizes anyway.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MIRROR = REPO_ROOT.parent / "shared" / "data" / "multi30k"


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
        if os.environ.get("CI"):  # CI must run the integration tests, never skip them silently
            pytest.fail(message)
        pytest.skip(message)
    return path
