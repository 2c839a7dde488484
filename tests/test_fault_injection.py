"""Faults around the pipeline: ``aiayn serve`` killed under load, a full disk at a write, the tracking server
gone, a stage run killed outright. (``kill -9`` inside each stage's writes: ``test_fault_campaign``.)

- ``aiayn serve`` SIGKILLed mid-write of the request log (the kill point ``request_log.rows_inserted``,
  ``aiayn.faults``) and under load, restarted on the same log: every answered request (HTTP 200 seen by the
  client) is logged exactly once with all its sentences; an unanswered one is absent or logged once.
- ``OSError(ENOSPC)`` raised at the write call of a checkpoint, a bundle and the request log: one line naming
  the file (never the temporary name), the previous file's bytes unchanged, no temporary file left.
- A required stage run (``Tracker(required=True)``, what the stage entry points open) whose tracking server
  goes away mid-run, or is gone when it starts: it fails in one line naming the store (mid-run: after MLflow's
  bounded retries, its outputs written); the run the outage cut is ended as ``KILLED`` by the next run of
  the stage, never left silently ``RUNNING``.
- A stage run killed outright under the ``pipeline`` flow's parent run is ended as ``KILLED`` by the next
  stage run; a run whose process still runs is not.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from aiayn.config.settings import FAULT_POINT_ENV, PARENT_RUN_ENV, TRACKING_ENV

pytestmark = pytest.mark.faults

BIN = Path(sys.executable).parent
#: Bounds a hang only (a test waits on events and states, never on elapsed time).
HANG_S = 900


# --------------------------------------------------------------------------- a stage run killed outright


_KILLED_STAGE = """
import sys
from aiayn.faults import fault_point
from aiayn.tracking import Tracker
with Tracker("train", project_root=sys.argv[1], tracking_uri=sys.argv[2], required=True) as t:
    t.log_metrics({"train/loss": 2.5}, step=1)
    t.flush()
    print(t.run_id, flush=True)
    fault_point("checkpoint.tensors_written")  # armed by the test: SIGKILL, the run never ends
"""


def test_a_stage_run_killed_outright_is_ended_by_the_next_stage_run_and_a_live_one_is_not(tmp_path):
    """Under the ``pipeline`` flow (``AIAYN_PARENT_RUN_ID``: the flow owns the pipeline run, the stages keep no
    state file) a stage killed by SIGKILL leaves its run ``RUNNING``; the next stage run to start ends it as
    ``KILLED`` (its process, named in its ``aiayn.process`` tag, is gone). A run whose process still runs (this
    test's own, open) is left ``RUNNING``."""
    from mlflow import MlflowClient

    from aiayn.config.settings import Settings
    from aiayn.tracking import PROCESS_TAG, Tracker, process_tag

    store = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    client = MlflowClient(tracking_uri=store)
    parent = client.create_run(client.create_experiment("aiayn"), run_name="pipeline").info.run_id
    env = os.environ | {FAULT_POINT_ENV: "checkpoint.tensors_written", PARENT_RUN_ENV: parent}
    proc = subprocess.run([sys.executable, "-c", _KILLED_STAGE, str(tmp_path), store], env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    killed = proc.stdout.split()[0]
    assert client.get_run(killed).info.status == "RUNNING"
    settings = Settings(parent_run_id=parent)
    with Tracker("evaluate", project_root=tmp_path, tracking_uri=store, settings=settings) as live:
        live_id = live.run_id
        assert client.get_run(killed).info.status == "KILLED"  # ended before this run was made
        assert client.get_run(live_id).data.tags[PROCESS_TAG] == process_tag()
        with Tracker("quantize", project_root=tmp_path, tracking_uri=store, settings=settings) as later:
            assert later.active
        assert client.get_run(live_id).info.status == "RUNNING"  # its process (this one) still runs
    assert client.get_run(live_id).info.status == "FINISHED"
    assert client.get_run(killed).data.metrics["train/loss"] == 2.5  # what it logged before the kill is kept


# --------------------------------------------------------------------------- what a killed writer leaves


_KILLED_WRITER = """
import os, signal, sys
from aiayn.io import atomic_dir, atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half")
    with atomic_dir(sys.argv[2]) as folder:
        (folder / "part").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_write_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    """A writer SIGKILLed inside ``atomic_path`` and ``atomic_dir`` leaves its temporary file and folder; the next
    write of the same output removes them, and leaves a live writer's and another output's alone."""
    from aiayn.io import _writer, atomic_dir, atomic_write_text

    target, folder = tmp_path / "report.json", tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target), str(folder)], capture_output=True,
                          timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and all(n.endswith(".tmp") for n in left) and not target.exists(), left
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        host = _writer().split("-", 1)[1]
        kept = [tmp_path / f".report.json.{live.pid}-{host}.abcdefgh.tmp", tmp_path / f".report.json.bak.{host}.tmp"]
        for p in kept:
            p.write_bytes(b"not ours to remove")
        atomic_write_text(target, "{}\n")
        with atomic_dir(folder) as out:
            (out / "scores.json").write_text("{}\n")
        assert sorted(tmp_path.iterdir()) == sorted([target, folder, *kept])  # the killed writer's are gone
    finally:
        live.kill()
        live.wait()


# --------------------------------------------------------------------------- a full disk


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_naming(e: BaseException, path: Path) -> str:
    message = str(e)
    assert "\n" not in message and "No space left on device" in message and str(path) in message, message
    assert ".tmp" not in message, message  # the file the user knows, never the temporary name
    return message


def test_a_full_disk_at_a_checkpoint_write_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    import torch

    from aiayn import checkpoint as ckpt

    def state(value: float) -> ckpt.TrainState:
        return ckpt.TrainState(step=50, model={"w": torch.full((8,), value)}, optimizer={"state": {}, "param_groups": []},
                               iterator={"epoch": 0}, rng=ckpt.capture_rng(), fingerprint="f", extra={})

    json_path = ckpt.save_checkpoint(tmp_path, state(1.0))
    before = _tree(tmp_path)
    monkeypatch.setattr(ckpt, "save_file", _full_disk)  # the tensor file's write: safetensors' save_file
    with pytest.raises(OSError) as e:
        ckpt.save_checkpoint(tmp_path, state(2.0))
    _one_line_naming(e.value, tmp_path / "ckpt_00000050.safetensors")
    assert _tree(tmp_path) == before  # the previous checkpoint's bytes, and no temporary file
    assert float(ckpt.load_checkpoint(json_path).model["w"][0]) == 1.0


@pytest.mark.parametrize("at", ["model copy", "bundle.json"])
def test_a_full_disk_while_writing_a_bundle_names_it_and_keeps_the_previous_bundle(served, monkeypatch, at):
    """ENOSPC at the copy of the CTranslate2 model into the bundle (an ``OSError`` naming no file, as a failed
    ``write`` raises it: the bundle folder is named) or at the write of ``bundle.json`` (the file is named)."""
    from aiayn.export import bundle as bundle_module
    from aiayn.export.bundle import build_bundle

    out = served["bundle"]
    before = _tree(out)
    if at == "model copy":
        real = shutil.copyfile
        monkeypatch.setattr(bundle_module.shutil, "copyfile",
                            lambda src, dst, **kw: _full_disk() if Path(dst).name == "model.bin" else real(src, dst, **kw))
        named = out
    else:
        real_write = Path.write_bytes
        monkeypatch.setattr(Path, "write_bytes", lambda self, data: _full_disk() if self.name.startswith(".bundle.json.")
                            else real_write(self, data))
        named = out / "bundle.json"
    with pytest.raises(OSError) as e:
        build_bundle(out, model_dir=served["model"], variant="ct2-float32", variant_dir=served["ct2"],
                     compute_type="float32", decode=served["options"], card={"name": "aiayn-test", "scores": {}})
    _one_line_naming(e.value, named)
    assert _tree(out) == before  # the previous bundle, byte for byte
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")) == []


class _FullDiskConnection:
    """A SQLite connection whose row writes fail as a full disk makes them (``executemany``)."""

    def __init__(self, db) -> None:
        self._db = db

    def executemany(self, *args):
        _full_disk()

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_full_disk_at_a_request_log_write_names_the_log_and_keeps_its_bytes(tmp_path):
    from aiayn.serving.request_log import LogWriteError, SqliteRequestLog

    path = tmp_path / "requests.db"
    log = SqliteRequestLog(path)
    row = dict(ts=1.0, model={"name": "m", "version": "1", "variant": "ct2-int8"}, beam_size=2, sources=["a man"],
               source_tokens=[3], output_tokens=[3], outputs=["ein Mann"])
    log.write("first", **row)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.endswith("-shm")}
    real, log._db = log._db, _FullDiskConnection(log._db)
    with pytest.raises(LogWriteError) as e:
        log.write("second", **row)
    _one_line_naming(e.value, path)
    log._db = real
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.endswith("-shm")} == files
    assert log.request_ids() == {"first": 1}  # rolled back: the log is as it was, and usable
    log.write("third", **row)
    assert log.request_ids() == {"first": 1, "third": 1}
    log.close()


# --------------------------------------------------------------------------- the service


OPTIONS_KW = dict(beam_size=2, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """A tiny CTranslate2 serving bundle (``support.tiny.serving_bundle``) and what it was built from."""
    from support import tiny

    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.stages import Layout

    root = tmp_path_factory.mktemp("served")
    options = DecodeOptions(**OPTIONS_KW)
    bundle = tiny.serving_bundle(root, options)
    return {"bundle": bundle, "model": Layout(root / "proj").model, "ct2": root / f"{bundle.name}-ct2",
            "options": options, "en": tiny.corpus(64, 3)[0]}


class Service:
    """``aiayn serve --bundle`` on a free port, logging to ``db``; ``point`` arms a kill point in it."""

    def __init__(self, bundle: Path, db: Path, point: str | None = None) -> None:
        from support.services import free_port

        self.port, self.db = free_port(), db
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = db.with_name(f"serve-{self.port}.log")
        env = {k: v for k, v in os.environ.items() if k != FAULT_POINT_ENV} | {"OMP_NUM_THREADS": "1"}
        env |= {FAULT_POINT_ENV: point} if point else {}
        cmd = [str(BIN / "aiayn"), "serve", "--bundle", str(bundle), "--port", str(self.port), "--log-path", str(db),
               "--poll-s", "0"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.out, "w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + HANG_S
        while not self._ready():
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}:\n{self.out.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve not ready:\n{self.out.read_text()[-3000:]}"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(HANG_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(HANG_S)


def _translate(url: str, sentences: list[str]) -> str | None:
    """The request id of the answer (HTTP 200), or None: no answer (the server died, a 5xx)."""
    try:
        r = httpx.post(f"{url}/translate", json={"sentences": sentences}, timeout=HANG_S)
    except httpx.HTTPError:
        return None
    return r.json()["request_id"] if r.status_code == 200 else None


def _logged(db: Path) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Per request id in the log: its ``requests`` rows, its sentence count there and its ``sentences`` rows."""
    con = sqlite3.connect(db, timeout=HANG_S)
    try:
        heads = dict(con.execute("SELECT request_id, count(*) FROM requests GROUP BY request_id").fetchall())
        sizes = dict(con.execute("SELECT request_id, max(n_sentences) FROM requests GROUP BY request_id").fetchall())
        rows = dict(con.execute("SELECT request_id, count(*) FROM sentences GROUP BY request_id").fetchall())
    finally:
        con.close()
    return heads, sizes, rows


@pytest.mark.timeout(900)
def test_serve_killed_under_load_and_mid_write_logs_every_answer_exactly_once(served, tmp_path):
    """1. A kill mid-write of the request log (``request_log.rows_inserted@3``: the third request's rows
    inserted, not committed): two answers, the third request unanswered and absent from the log.
    2. Restarted on the same log, under load from 4 clients, SIGKILLed once 20 more answers were seen.
    3. Restarted again: it serves, and every answered request is in the log exactly once with all its
    sentences; an unanswered one is absent or in it once, never in part."""
    db, sentences = tmp_path / "requests.db", served["en"][:3]
    first = Service(served["bundle"], db, point="request_log.rows_inserted@3")
    answered = [_translate(first.url, sentences) for _ in range(3)]
    assert first.proc.wait(HANG_S) == -signal.SIGKILL
    assert answered[:2] == [a for a in answered[:2] if a] and answered[2] is None, answered
    assert _logged(db)[0] == {a: 1 for a in answered[:2]}  # the uncommitted third is not in the log

    second = Service(served["bundle"], db)
    seen, lost, enough, stop = list(answered[:2]), [0], threading.Event(), threading.Event()
    lock = threading.Lock()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            rid = _translate(second.url, served["en"][(k * 7 + i) % 60:][:1 + i % 3])
            i += 1
            with lock:
                seen.append(rid) if rid else lost.__setitem__(0, lost[0] + 1)
                if len(seen) >= 22:
                    enough.set()
            if rid is None and second.proc.poll() is not None:
                return

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    assert enough.wait(HANG_S), "fewer than 20 answers under load"
    assert second.kill() == -signal.SIGKILL  # while the clients keep sending
    stop.set()
    for t in threads:
        t.join(HANG_S)

    third = Service(served["bundle"], db)
    try:
        last = _translate(third.url, sentences)
        assert last is not None
    finally:
        third.stop()
    heads, sizes, rows = _logged(db)
    missing = [a for a in seen + [last] if heads.get(a) != 1]
    assert not missing, f"answered but not logged exactly once: {missing}"
    unanswered = set(heads) - set(seen) - {last}
    assert len(unanswered) <= lost[0], (unanswered, lost)  # at most the requests that got no answer
    assert all(h == 1 for h in heads.values()) and rows == sizes  # no request twice, none in part


# --------------------------------------------------------------------------- the tracking server gone


_CUT_STAGE = """
import sys
from aiayn.tracking import Tracker, TrackingLostError
try:
    with Tracker("evaluate", project_root=sys.argv[1], tracking_uri=sys.argv[2], required=True, flush_every=1) as t:
        t.log_metrics({"test.bleu": 1.0}, step=0)
        print(t.run_id, flush=True)
        sys.stdin.readline()  # the test stops the server, then says go on
        t.log_metrics({"test.bleu": 2.0}, step=1)  # MLflow's bounded retries, then tracking is lost
        print("outputs written", flush=True)
except TrackingLostError as e:
    print(f"evaluate: error: {e}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.mark.timeout(900)
def test_a_tracking_server_gone_fails_the_stage_in_one_line_and_its_run_is_ended_later(tmp_path):
    """A real ``mlflow server`` on a SQLite store. Mid-run: a stage process (a required run, as the stage entry
    points open) logs, the server stops, its next write fails after MLflow's bounded retries; the stage finishes
    its work and exits 1 with one line naming the store and the run. Between stages: the server down, the next
    stage fails at once, before any work, naming the store. The next run of the stage on the same store (read
    here through its SQLite file: the server need not be started again for it) ends the cut run as ``KILLED``;
    no run is missing (each started run is in the store) or left ``RUNNING``."""
    from mlflow import MlflowClient

    from support.services import MlflowServer

    from aiayn.config.settings import Settings
    from aiayn.tracking import Tracker, TrackingLostError

    db = tmp_path / "mlflow.db"
    server = MlflowServer(tmp_path / "server", backend_store_uri=f"sqlite:///{db.as_posix()}",
                          artifacts_destination=str(tmp_path / "artifacts"))
    server.start()
    try:
        remote = MlflowClient(tracking_uri=server.url)  # the pipeline flow's run, which the stages nest under
        pipeline_run = remote.create_run(remote.create_experiment("aiayn"), run_name="pipeline").info.run_id
        env = {k: v for k, v in os.environ.items() if k != TRACKING_ENV} | {PARENT_RUN_ENV: pipeline_run}
        stage = subprocess.Popen([sys.executable, "-c", _CUT_STAGE, str(tmp_path), server.url], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        cut = stage.stdout.readline().strip()
        server.stop()  # the server goes away mid-run
        out, err = stage.communicate("go on\n", timeout=HANG_S)
        assert stage.returncode == 1 and "outputs written" in out, (out, err[-3000:])
        line = err.strip().splitlines()[-1]
        assert line.startswith("evaluate: error: stage evaluate: its MLflow run") and cut in line, err[-3000:]
        assert server.url in line and "incomplete" in line, line

        with pytest.raises(TrackingLostError, match="could not be started in .*unreachable") as e:
            with Tracker("quantize", project_root=tmp_path, tracking_uri=server.url, required=True):
                pytest.fail("the stage ran with its tracking server down")
        assert "\n" not in str(e.value) and server.url in str(e.value)
    finally:
        server.stop()
    store = f"sqlite:///{db.as_posix()}"
    with Tracker("evaluate", project_root=tmp_path, tracking_uri=store, required=True,
                 settings=Settings(parent_run_id=pipeline_run)) as again:
        again.log_metrics({"test.bleu": 2.0}, step=1)
        rerun = again.run_id
    client = MlflowClient(tracking_uri=store)
    assert client.get_run(cut).info.status == "KILLED"  # ended by the next run of the stage
    assert client.get_run(cut).data.metrics["test.bleu"] == 1.0  # what it logged before the outage is kept
    assert client.get_run(rerun).info.status == "FINISHED"
    statuses = {r.info.run_id: r.info.status for x in client.search_experiments() for r in client.search_runs([x.experiment_id])}
    # the one run still open is the pipeline run, which its flow (here: this test) owns and ends
    assert [r for r, s in statuses.items() if s == "RUNNING"] == [pipeline_run], statuses
