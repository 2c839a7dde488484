"""What machine a timing came from: CPU model, vector ISA, cores, and a 2-thread fp32 matmul probe.

Hosts of one kind differ about 2x in speed (the same 2-core cloud machine type ran the tiny model
at 1,500 and at 3,000 target tokens/s), so every timing this project prints (benchmarks, the main
job's report, CI) carries this line beside it::

    python -m aiayn.host          # one line: CPU, ISA, cores, GFLOP/s
    python -m aiayn.host --json   # the same as JSON

The probe multiplies two 1024 x 1024 fp32 matrices on 2 threads (2 * 1024**3 FLOP each) and
reports the median GFLOP/s over ``rounds`` timed products after a warm-up. It restores the caller's
thread count. About 0.1-0.5 s on a 2-core host.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass

__all__ = ["HostInfo", "host_info", "matmul_gflops"]

#: ISA flags that change float and int8 kernels (oneDNN/MKL/Inductor pick code paths by them).
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class HostInfo:
    """``cpu``: model name; ``vendor``: ``GenuineIntel``, ``AuthenticAMD``, ... (empty when unknown); ``isa``: the relevant flags present (``_ISA_FLAGS`` order); ``cores``: usable
    CPUs of this process; ``matmul_gflops``: 2-thread fp32 1024^3 matmul, median (GFLOP/s)."""

    cpu: str
    vendor: str
    isa: tuple[str, ...]
    cores: int
    matmul_gflops: float

    def line(self) -> str:
        """``host: <cpu>, <cores> cores, ISA <flags>, 2-thread fp32 matmul <x> GFLOP/s``."""
        return (f"host: {self.cpu}, {self.cores} cores, ISA {' '.join(self.isa) or 'baseline'}, "
                f"2-thread fp32 matmul {self.matmul_gflops:.0f} GFLOP/s")


def _cpuinfo() -> tuple[str, str, tuple[str, ...]]:
    name, vendor, flags = platform.processor() or platform.machine(), "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    name = value.strip()
                elif key == "vendor_id":
                    vendor = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if name and flags and key == "":
                    break
    except OSError:
        pass
    return name, vendor, tuple(f for f in _ISA_FLAGS if f in flags)


def matmul_gflops(*, threads: int = 2, n: int = 1024, rounds: int = 9) -> float:
    """Median fp32 ``(n, n) @ (n, n)`` throughput on ``threads`` intra-op threads, in GFLOP/s."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        for _ in range(2):  # warm-up: thread pool, caches, frequency
            a @ b
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / statistics.median(times) / 1e9


def host_info(*, probe: bool = True) -> HostInfo:
    """This host's ``HostInfo`` (``probe=False``: no matmul, ``matmul_gflops`` 0)."""
    cpu, vendor, isa = _cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return HostInfo(cpu, vendor, isa, cores, round(matmul_gflops(), 1) if probe else 0.0)


if __name__ == "__main__":
    info = host_info()
    print(json.dumps(asdict(info)) if "--json" in sys.argv[1:] else info.line())
