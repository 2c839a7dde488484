"""An ``aiayn serve`` (or any HTTP service with ``GET /ready``) on a free loopback port, in its own process group.

Shared by ``perf/serve_load.py`` and ``perf/serve_soak.py``. The service runs in its own process group so that
what it starts (LitServe's inference workers) stops with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(cmd: list[str], url: str, errors: Path, *, env: dict[str, str] | None = None,
                  timeout_s: float = 180) -> subprocess.Popen:
    """Start ``cmd`` (stderr to ``errors``; ``env``: its environment, default this one's) and wait until
    ``url/ready`` answers 200; raises ``RuntimeError`` (the tail of ``errors``) when it exits or is not ready
    within ``timeout_s``."""
    import httpx

    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(errors, "w"), start_new_session=True,
                              env=env)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            stop_service(server)
            raise RuntimeError(f"service did not start: {errors.read_text()[-2000:]}")
        time.sleep(0.2)


def stop_service(server: subprocess.Popen) -> None:
    """SIGTERM to the service's process group; SIGKILL after 60 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
