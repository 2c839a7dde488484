"""Real services for the ``services`` test tier: processes on free loopback ports, always stopped.

Not a test module (no ``test_`` prefix): the ``services`` tests import it. Each service is a small
class with ``start()`` / ``stop()`` that runs the real program in its own process group:

- ``Postgres``: Debian's PostgreSQL (``initdb -A trust`` + ``pg_ctl``), data in a folder that
  survives ``stop()`` so a restart finds the same databases. As root, the server runs as the
  ``postgres`` user (PostgreSQL refuses root), its folder outside pytest's root-only temp dirs;
  ``stop()`` is PostgreSQL's fast shutdown, so the data folder is clean for the next ``start()``.
- ``S3``: moto's S3-compatible server (``moto_server``). It keeps objects in memory; its recorder
  (``MOTO_ENABLE_RECORDING``) appends every request to a file, and ``start()`` on a folder that holds a
  recording replays it, so a restarted endpoint serves the same buckets and objects (moto's own
  persistence mechanism: docs "Recorder"). Limit: objects uploaded in parts (boto3 does so from
  8 MiB) do not come back (moto draws upload ids from ``os.urandom``); the smoke pipeline's are smaller.
- ``MlflowServer``: ``mlflow server`` on a backend store URI, proxying artifacts
  (``--artifacts-destination``, ``--serve-artifacts``): clients need no S3 credentials.
- ``PrefectServer``: ``prefect server start`` (optionally on Postgres, UI on or off).

``require(binary)`` finds a program; a missing one skips the test, an environment skip, which fails it
under ``AIAYN_TEST_STRICT=1`` (``support.strict``; set by ``.ci/run``: CI must run these tests).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
STOP_TIMEOUT_S = 20

#: Credentials of the test S3 endpoint (moto accepts any); never real ones.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5) -> object:
    """Poll ``predicate`` until it returns something truthy; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not after {timeout_s} s")


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def start_process(cmd: list[str], env: dict[str, str], log: Path, *, user: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session (process group), output appended to ``log``."""
    with open(log, "a") as out:  # the child keeps its own handle
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                user=user, group=user)


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM the process group, SIGKILL it if it has not exited after ``STOP_TIMEOUT_S``."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
            return
        except subprocess.TimeoutExpired:
            continue


def require(binary: str, *, hint: str) -> str:
    """Path of ``binary`` (PATH, the venv, or a glob); skip without it (a failure under ``AIAYN_TEST_STRICT=1``)."""
    found = shutil.which(binary) or shutil.which(binary, path=str(VENV_BIN))
    if found is None and any(c in binary for c in "*?["):
        matches = sorted(glob.glob(binary))
        found = matches[-1] if matches else None
    if found:
        return found
    pytest.skip(f"{binary} not found: {hint}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class _Service:
    name = "service"
    start_timeout_s = 120.0

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log = self.folder / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    def _wait_healthy(self, healthy: Callable[[], bool]) -> None:
        def check() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail(self.log)}")
            return healthy()

        wait_for(check, self.start_timeout_s, f"{self.name} healthy")

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


class Postgres(_Service):
    """PostgreSQL on 127.0.0.1:``port``; superuser ``postgres``, trust authentication (loopback only)."""

    name = "postgres"
    start_timeout_s = 60.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        initdb = require("/usr/lib/postgresql/*/bin/initdb", hint="install Debian's postgresql (make system-deps)")
        self.bin = Path(initdb).parent
        self.user = "postgres" if os.geteuid() == 0 else None
        # as root the server runs as `postgres`, which cannot enter pytest's root-only temp folders
        self.data = Path(tempfile.mkdtemp(prefix="aiayn-pg-")) if self.user else self.folder / "data"
        self.port = free_port()
        if self.user:
            shutil.chown(self.data, self.user)
        subprocess.run([str(self.bin / "initdb"), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                        "-D", str(self.data / "pgdata")], check=True, capture_output=True, text=True,
                       user=self.user, group=self.user)

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data}"
        self.proc = start_process([str(self.bin / "postgres"), "-D", str(self.data / "pgdata"), *opts.split()],
                                  dict(os.environ), self.log, user=self.user)
        self._wait_healthy(lambda: subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                                                   "-U", "postgres"], capture_output=True).returncode == 0)

    def stop(self) -> None:
        """Fast shutdown (``SIGINT``: disconnect clients, checkpoint), then wait for the postmaster."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        super().stop()

    def create_database(self, name: str) -> None:
        subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
                       check=True, capture_output=True, text=True)

    def url(self, database: str, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


# `moto_server` serving one request at a time: its recorder appends each request to the file in two
# unlocked writes, so concurrent uploads (DVC pushes in parallel) interleave lines and the recording
# cannot be replayed. One thread also means HTTP/1.0, one request per connection.
_MOTO_ONE_THREAD = """
import sys
import moto.server as m
_run = m.run_simple
def run_one_thread(*args, **kwargs):
    kwargs["threaded"] = False
    return _run(*args, **kwargs)
m.run_simple = run_one_thread
m.main(sys.argv[1:])
"""


class S3(_Service):
    """moto's S3 endpoint at ``self.url``; requests recorded to ``folder/recording.jsonl`` and replayed
    on the next ``start()`` (same port), so objects outlive a restart."""

    name = "s3"
    start_timeout_s = 60.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        require("moto_server", hint="pip install 'moto[server]' (requirements.lock)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.recording = self.folder / "recording.jsonl"

    def start(self) -> None:
        env = {**os.environ, **S3_ENV, "MOTO_ENABLE_RECORDING": "true", "MOTO_RECORDER_FILEPATH": str(self.recording)}
        self.proc = start_process([sys.executable, "-c", _MOTO_ONE_THREAD, "-H", "127.0.0.1", "-p", str(self.port)],
                                  env, self.log)
        self._wait_healthy(lambda: http_ok(f"{self.url}/moto-api/"))
        if self.recording.exists() and self.recording.stat().st_size:
            # moto's own replay, run here: the one-thread server cannot answer its own replay requests
            from unittest import mock

            from moto.moto_api._internal.recorder.models import Recorder

            self._recorder("stop-recording")  # do not record the replay itself
            with mock.patch.dict(os.environ, {"MOTO_RECORDER_FILEPATH": str(self.recording)}):
                Recorder().replay_recording(target_host=self.url)
            self._recorder("start-recording")

    def _recorder(self, action: str) -> None:
        req = urllib.request.Request(f"{self.url}/moto-api/recorder/{action}", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200, f"moto recorder {action} answered {resp.status}"

    def client(self):  # boto3 S3 client of this endpoint
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")


class MlflowServer(_Service):
    """``mlflow server`` at ``self.url`` on ``backend_store_uri``, artifacts proxied to ``artifacts_destination``."""

    name = "mlflow"
    start_timeout_s = 180.0

    def __init__(self, folder: Path, *, backend_store_uri: str, artifacts_destination: str,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(folder)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend_store_uri, self.artifacts_destination = backend_store_uri, artifacts_destination
        self.env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}

    def start(self) -> None:
        self.proc = start_process(
            [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", self.backend_store_uri, "--artifacts-destination", self.artifacts_destination,
             "--serve-artifacts"], self.env, self.log)
        self._wait_healthy(lambda: http_ok(f"{self.url}/health"))


class PrefectServer(_Service):
    """``prefect server start`` at ``self.api_url`` (``PREFECT_HOME`` in ``folder``)."""

    name = "prefect"
    start_timeout_s = 180.0

    def __init__(self, folder: Path, *, database_url: str | None = None, ui: bool = False) -> None:
        super().__init__(folder)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"{self.url}/api"
        self.env = {**os.environ, "PREFECT_HOME": str(self.folder / "home"), "PREFECT_API_URL": self.api_url,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": str(ui).lower(),
                    "DO_NOT_TRACK": "1"}
        if database_url:
            self.env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url

    def start(self) -> None:
        self.proc = start_process([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                   "--port", str(self.port)], self.env, self.log)
        self._wait_healthy(lambda: http_ok(f"{self.api_url}/health"))
