"""A rank that takes ``STOP_S`` seconds to stop after SIGTERM, as a rank writing a big checkpoint does
(tests/test_distributed.py, the launcher's grace). Launched by ``aiayn.train.distributed.torchrun_command``.

``python -m support.slow_stop_rank OUT``: writes ``OUT/ready.<rank>``, waits for SIGTERM, works
``STOP_S`` seconds, then writes ``OUT/stopped.<rank>``. No process group: only the launcher is tested.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

STOP_S = 40  # longer than torchrun's own 30 s grace


def main() -> int:
    out, rank = Path(sys.argv[1]), os.environ["RANK"]
    got = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: got.set())
    (out / f"ready.{rank}").write_text("")
    got.wait(600)
    time.sleep(STOP_S)  # the checkpoint being written
    (out / f"stopped.{rank}").write_text("")
    return 0


if __name__ == "__main__":
    sys.exit(main())
