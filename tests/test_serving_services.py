"""Real serving processes on free loopback ports: MLflow's own scoring server on the registered
champion (``mlflow models serve``), and ``aiayn serve``'s graceful shutdown on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from support import tiny  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402
from aiayn.inference.load import BundlePredictor  # noqa: E402

pytestmark = [pytest.mark.services, pytest.mark.slow]

BIN = Path(sys.executable).parent
OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    bundle = tiny.serving_bundle(root, OPTIONS)
    store = f"sqlite:///{root / 'mlflow.db'}"
    from aiayn.tracking import Tracker
    from aiayn.export.bundle import register_bundle

    with Tracker("export", project_root=root, tracking_uri=store, end_pipeline=True) as t:
        assert register_bundle(t, bundle, name="aiayn-en-de", variant="ct2-float32", gate_split="test_a",
                               bleu=1.0, example=["a man"])["alias"] == "champion"
    return {"root": root, "bundle": bundle, "store": store, "en": tiny.corpus(12, 3)[0]}


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"server not up after {timeout} s:\n{log.read_text()[-3000:]}")


def test_mlflow_models_serve_answers_every_payload_shape_in_order(world):
    port = tiny.free_port()
    env = os.environ | {"MLFLOW_TRACKING_URI": world["store"], "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    log = world["root"] / "mlflow-serve.log"
    proc = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m", "models:/aiayn-en-de@champion",
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            env=env, cwd=world["root"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/ping", proc, log)
        src = world["en"]
        want = BundlePredictor(world["bundle"]).translator.translate(src, OPTIONS)
        url = f"http://127.0.0.1:{port}/invocations"
        payloads = [{"inputs": src},
                    {"dataframe_split": {"columns": ["sentence"], "data": [[s] for s in src]}},
                    {"dataframe_records": [{"sentence": s} for s in src]}]
        for body in payloads:
            r = httpx.post(url, json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["predictions"] == want, body
        for wrong in ({"inputs": {"x": [1]}}, {"inputs": []}, {"sentences": src}):  # a 400 naming the problem, not a 500
            bad = httpx.post(url, json=wrong, timeout=60)
            assert bad.status_code == 400, (wrong, bad.status_code, bad.text)
    finally:
        proc.terminate()
        proc.wait(30)


def test_mlflow_models_serve_without_a_reachable_registry_exits_with_a_message(world):
    env = os.environ | {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{tiny.free_port()}", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(BIN / "mlflow"), "models", "serve", "-m", "models:/aiayn-en-de@champion",
                           "--env-manager", "local", "-p", str(tiny.free_port())],
                          env=env, cwd=world["root"], capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "Connection" in proc.stderr or "connect" in proc.stderr.lower(), proc.stderr[-2000:]
    # and `aiayn serve` says it in one line
    proc = subprocess.run([str(BIN / "aiayn"), "serve", "--port", str(tiny.free_port()), "--log-path",
                           str(world["root"] / "x.db")], env=env, cwd=world["root"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "unreachable" in proc.stderr, proc.stderr[-2000:]


def _metric(url: str, name: str) -> float:
    """One sample of the service's Prometheus text (0 when absent), e.g. ``aiayn_batch_sentences_sum``."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen after {timeout} s")
        time.sleep(0.02)


def test_sigterm_finishes_requests_in_flight_and_flushes_the_log(world, tmp_path):
    """SIGTERM with requests in flight: each is finished, answered 200 and logged, and the log's WAL is
    checkpointed. The requests are in flight at the signal on any host, fast or slow: the test holds
    the request log's write lock (``BEGIN IMMEDIATE``) from before they are sent until uvicorn says it
    waits for their connections, so each is decoded and waits to be logged (an answer is never sent
    unlogged) when the signal comes. (The old version raced the host: on a slow CI host every request
    had been answered before the signal, and the test failed.)"""
    n = 4  # each request waiting on the log holds one of asyncio's worker threads (min(32, cores + 4))
    port = tiny.free_port()
    log_db = tmp_path / "requests.db"
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([str(BIN / "aiayn"), "serve", "--bundle", str(world["bundle"]), "--port", str(port),
                             "--log-path", str(log_db), "--poll-s", "0"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    sentences = [world["en"][3 * i : 3 * i + 3] for i in range(n)]
    try:
        _wait(f"{url}/ready", proc, log, timeout=120)
        holder = sqlite3.connect(log_db, isolation_level=None, timeout=30)
        holder.execute("BEGIN IMMEDIATE")  # the service's log writes wait (busy timeout: 10 s)
        try:
            with httpx.Client(timeout=60) as client, ThreadPoolExecutor(n) as pool:
                futures = [pool.submit(client.post, f"{url}/translate", json={"sentences": s}) for s in sentences]
                _until(lambda: _metric(url, "aiayn_batch_sentences_sum") >= 3 * n, "every sentence decoded")
                answered_before = _metric(url, 'aiayn_requests_total{status="200"}')
                proc.send_signal(signal.SIGTERM)
                _until(lambda: "Waiting for connections to close" in log.read_text(), "the drain waiting on the requests")
                holder.execute("ROLLBACK")
                answers = [f.result() for f in futures]
        finally:
            holder.close()
        assert answered_before == 0, "a request was answered before the signal: nothing was left to drain"
        assert [a.status_code for a in answers] == [200] * n, [a.text for a in answers]
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its graceful shutdown
    finally:
        if proc.poll() is None:
            proc.kill()
    logged = sqlite3.connect(log_db).execute("SELECT request_id FROM requests").fetchall()
    assert sorted(r[0] for r in logged) == sorted(json.loads(a.text)["request_id"] for a in answers)
    assert not Path(str(log_db) + "-wal").exists() or Path(str(log_db) + "-wal").stat().st_size == 0
    assert json.loads(answers[0].text)["translations"] == BundlePredictor(world["bundle"]).translator.translate(sentences[0], OPTIONS)


def test_two_replicas_on_postgres_log_every_answer_exactly_once(world, tmp_path):
    """Two ``aiayn serve`` replicas write one PostgreSQL request log; 100 concurrent clients
    spread over them, in two waves with every database connection dropped in between: every
    answered sentence is logged exactly once, and the drift monitor reads the window from the same
    database."""
    from support.services import Postgres

    from aiayn.serving.request_log import open_request_log
    from monitoring.drift import read_log_window

    pg = Postgres(tmp_path / "pg")
    pg.start()
    replicas: list[tuple[subprocess.Popen, str, Path]] = []
    try:
        pg.create_database("serving")
        url = f"postgresql://postgres@127.0.0.1:{pg.port}/serving"
        for r in range(2):
            port, log = tiny.free_port(), tmp_path / f"replica{r}.log"
            proc = subprocess.Popen([str(BIN / "aiayn"), "serve", "--bundle", str(world["bundle"]), "--port", str(port),
                                     "--log-url", url, "--poll-s", "0", "--max-wait-ms", "20"],
                                    stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
            replicas.append((proc, f"http://127.0.0.1:{port}", log))
        for proc, base, log in replicas:
            _wait(f"{base}/ready", proc, log, timeout=180)

        def client(i: int) -> tuple[int, str | None, int]:
            sentences = [world["en"][(i + k) % len(world["en"])] for k in range(1 + i % 4)]
            r = httpx.post(f"{replicas[i % 2][1]}/translate", json={"sentences": sentences}, timeout=300)
            return r.status_code, r.json().get("request_id"), len(sentences)

        with ThreadPoolExecutor(100) as pool:
            answers = list(pool.map(client, range(50)))
            # every replica's database connections dropped (a Postgres restart or failover): the next
            # writes reconnect and retry once, and a retry never logs a request twice
            import psycopg2

            with psycopg2.connect(url) as conn, conn.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = 'serving' AND pid <> pg_backend_pid()")
                assert len(cur.fetchall()) >= 2
            conn.close()
            answers += list(pool.map(client, range(50, 100)))
        assert [code for code, _, _ in answers] == [200] * 100
        with open_request_log(url) as rl:
            assert rl.counts() == {"requests": 100, "sentences": sum(n for _, _, n in answers)}
            window = rl.latest(1000)
            per_request = rl.request_ids()
        assert per_request == {rid: n for _, rid, n in answers}  # each answer once, with all its sentences
        sentences, info = read_log_window(url, 10)
        assert sentences == [s.source for s in window[-10:]] and info["log"] == url
        for proc, _, _ in replicas:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        for proc, _, _ in replicas:
            if proc.poll() is None:
                proc.kill()
        pg.remove()
