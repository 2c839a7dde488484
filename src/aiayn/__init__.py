"""aiayn: reproducible Attention Is All You Need translation pipeline.

Importing ``aiayn`` sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the user set it) before torch loads
its OpenMP runtime: idle OpenMP workers sleep instead of spinning. On a 2-core machine with one
or two other busy processes, 2-thread training keeps ~0.5 of its idle speed instead of ~0.3-0.4;
idle it costs ~8 % (docs/benchmarks.md, ``benchmarks/contention.py``). The wait policy changes
speed only, never results. It has no effect when torch was imported before ``aiayn``.
"""

import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
