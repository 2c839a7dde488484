"""One measured host factor for the few test bounds where elapsed time IS the claim.

Most tests wait on events and states (a log line, a file, a metric, a process state), with an overall
deadline that only bounds a hang. A few claims are about time itself: a server's configured body
timeout must fire ("at least the configured timeout, and not forever"), ``/health`` must answer
while a large request is prepared. Their lower bounds come from the configuration; their upper
bounds are written for the fastest host seen and scaled here, in one place, by how much slower this
host is right now::

    HOST_FACTOR = max(1, REFERENCE_GFLOPS / measured)
    scaled(seconds) = seconds * HOST_FACTOR

``measured`` is ``aiayn.host.matmul_gflops()`` (what ``python -m aiayn.host`` prints: the median
GFLOP/s of a 2-thread fp32 1024 x 1024 matmul), taken once per test process on first use and cached,
so it sees the load the neighbours put on the shared cores at that time. ``REFERENCE_GFLOPS`` is the
fastest host seen (~350 GFLOP/s, a 2-core AVX-512 host, idle): there the factor is 1 and the bounds
are as written; the slowest hosts seen under load (~60 GFLOP/s, and 23 on a loaded 2-core AVX2 host)
give factors of ~6 to ~15. ``AIAYN_HOST_FACTOR`` (a number >= 1) overrides the measurement, e.g. to
reproduce a failure with the factor a CI log printed.
"""

from __future__ import annotations

import functools
import os

__all__ = ["REFERENCE_GFLOPS", "host_factor", "scaled", "measured_gflops"]

#: 2-thread fp32 matmul GFLOP/s of the fastest host seen (``python -m aiayn.host``): factor 1 there.
REFERENCE_GFLOPS = 350.0


@functools.cache
def measured_gflops() -> float:
    """This host's 2-thread fp32 matmul GFLOP/s (``aiayn.host.matmul_gflops``), measured once per process."""
    from aiayn.host import matmul_gflops

    return matmul_gflops()


@functools.cache
def host_factor() -> float:
    """``max(1, REFERENCE_GFLOPS / measured_gflops())``, or ``AIAYN_HOST_FACTOR`` when set; cached."""
    override = os.environ.get("AIAYN_HOST_FACTOR")
    if override:
        return max(1.0, float(override))
    return max(1.0, REFERENCE_GFLOPS / measured_gflops())


def scaled(seconds: float) -> float:
    """``seconds`` (a bound written for the fastest host) times this host's factor."""
    return seconds * host_factor()


def __getattr__(name: str) -> float:
    """``HOST_FACTOR``: ``host_factor()``, measured on first access (importing this module costs nothing)."""
    if name == "HOST_FACTOR":
        return host_factor()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
