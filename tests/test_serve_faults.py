"""``aiayn serve`` against hostile and broken clients: real ``aiayn serve`` processes on free
loopback ports, each case as a client would meet it.

Hostile JSON (a 5,000-digit number, 1,000 and 50,000 nested arrays, a lone surrogate), one giant
request while ``/health`` is watched, a client that hangs up mid-decode, unknown characters (the
server log holds counts and ids, never text), a stalled body, retention on its own timer with a
prune that fails, SIGTERM with 50 stalled uploads and a request in flight, and a taken port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from support import tiny  # noqa: E402
from support.services import wait_for  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402

BIN = Path(sys.executable).parent
OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return {"root": root, "bundle": tiny.serving_bundle(root, OPTIONS), "en": tiny.corpus(64, 3)[0]}


class ServeProcess:
    """``aiayn serve --bundle`` in its own process; its output (the server log) in ``self.log``."""

    def __init__(self, bundle: Path, folder: Path, *args: str) -> None:
        self.port = tiny.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = folder / "requests.db"
        self.log = folder / f"serve-{self.port}.log"
        cmd = [str(BIN / "aiayn"), "serve", "--bundle", str(bundle), "--port", str(self.port),
               "--log-path", str(self.db), "--poll-s", "0", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve not ready:\n{self.text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """A counter's value from /metrics (0 when absent)."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def rows(self) -> int:
        return sqlite3.connect(self.db, timeout=10).execute("SELECT count(*) FROM sentences").fetchone()[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture(scope="module")
def server(world, tmp_path_factory):
    s = ServeProcess(world["bundle"], tmp_path_factory.mktemp("shared"))  # defaults: a 10 s body timeout
    yield s
    s.stop()


def post_raw(url: str, body: bytes, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/translate", content=body, headers={"content-type": "application/json"}, timeout=timeout)


# --------------------------------------------------------------------------- hostile JSON


@pytest.mark.parametrize("body, kind, needle", [
    (b'{"sentences":["A dog."],"beam_size":1' + b"0" * 5000 + b"}", "invalid_json", "4300 digits"),
    (b'{"sentences": ' + b"[" * 1000 + b"]" * 1000 + b"}", "invalid_json", "nested too deeply"),
    (b'{"sentences": ' + b"[" * 50000 + b"]" * 50000 + b"}", "invalid_json", "nested too deeply"),
    (b'{"sentences":["\\ud800 A man rides a bike."]}', "invalid_text", "sentences[0] holds a lone UTF-16 surrogate"),
])  # fmt: skip
def test_hostile_json_is_a_counted_400_naming_the_problem(server, body, kind, needle):
    before = (server.metric("aiayn_requests_total", status="400"), server.metric("aiayn_errors_total", kind=kind),
              server.rows())
    r = post_raw(server.url, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == kind and needle in r.json()["detail"], r.text
    assert server.metric("aiayn_requests_total", status="400") == before[0] + 1
    assert server.metric("aiayn_errors_total", kind=kind) == before[1] + 1
    assert server.rows() == before[2]  # nothing logged
    assert server.metric("aiayn_requests_total", status="500") == 0 and "Traceback" not in server.text()
    assert post_raw(server.url, b'{"sentences": ["a man"]}').status_code == 200  # still serving


# --------------------------------------------------------------------------- one giant request


def test_a_giant_request_is_refused_at_once_and_health_never_stalls(server):
    """250,000 characters without a space (a 250 KB body, under the 256 KiB limit): the token limit
    is checked first, in one tokenizer pass, off the event loop; /health keeps answering."""
    answer: list[httpx.Response] = []
    t0 = time.monotonic()
    big = threading.Thread(target=lambda: answer.append(post_raw(server.url, b'{"sentences":["' + b"a" * 250_000 + b'"]}')))
    big.start()
    worst = 0.0
    with httpx.Client(base_url=server.url, timeout=60) as c:
        while big.is_alive() or not worst:
            t = time.monotonic()
            assert c.get("/health").json() == {"status": "alive"}
            worst = max(worst, time.monotonic() - t)
            time.sleep(0.02)
    big.join()
    took = time.monotonic() - t0
    assert answer[0].status_code == 422 and "source tokens" in answer[0].json()["detail"], answer[0].text
    assert took < 10, f"the over-long request took {took:.1f} s to refuse"
    assert worst < 2.0, f"/health took {worst:.2f} s while the request was prepared"


# --------------------------------------------------------------------------- the client hangs up


def test_a_client_that_hangs_up_is_neither_decoded_on_nor_logged(world, tmp_path):
    """Three clients (a client retrying) send 64 sentences at beam 8 and hang up after 0.2 s while the one
    decoding worker is busy with another request (2048 sentences): their requests leave the queue undecoded
    (the server's batch count grows by the busy request's and the patient one's only) and unlogged, so the
    drift window holds no duplicates; then one patient request is logged exactly once.

    The old version sent the 64 sentences to an idle server and relied on their decoding taking over 0.2 s:
    a lone request is decoded at once (no batching wait), and a 2-core AVX-512 host decodes it in 0.17 s
    (CI went red there). What is timed now is only that 2048 sentences take longer than three 0.2 s hang-ups
    (~5 s on that host), and the test says so if a host ever beats it."""
    busy_body = {"sentences": [s for _ in range(32) for s in world["en"]], "beam_size": 8}
    server = ServeProcess(world["bundle"], tmp_path, "--max-sentences", str(len(busy_body["sentences"])),
                          "--max-body-bytes", str(1 << 20), "--max-request-tokens", str(1 << 20))
    try:
        rows, gone = server.rows(), server.metric("aiayn_requests_total", status="499")
        batches = server.metric("aiayn_batch_sentences_count")
        result: dict = {}
        busy = threading.Thread(target=lambda: result.update(r=httpx.post(f"{server.url}/translate", json=busy_body,
                                                                           timeout=600)))
        busy.start()
        wait_for(lambda: server.metric("aiayn_batch_sentences_count") > batches or not busy.is_alive(), 60,
                 "the busy request's decoding")
        assert busy.is_alive(), f"the busy request ended first: {result['r'].status_code} {result['r'].text[:300]}"
        body = {"sentences": world["en"], "beam_size": 8}
        for _ in range(3):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{server.url}/translate", json=body, timeout=0.2)
        assert busy.is_alive(), "2048 sentences decoded before three 0.2 s hang-ups ended: give the busy request more"
        busy.join(600)
        assert result["r"].status_code == 200 and len(result["r"].json()["translations"]) == len(busy_body["sentences"])
        wait_for(lambda: server.metric("aiayn_requests_total", status="499") >= gone + 3, 120,
                 "the server noticing the three clients hang up")
        assert server.rows() == rows + len(busy_body["sentences"])
        r = httpx.post(f"{server.url}/translate", json=body, timeout=300)
        assert r.status_code == 200 and len(r.json()["translations"]) == 64
        assert server.rows() == rows + len(busy_body["sentences"]) + 64
        assert server.metric("aiayn_batch_sentences_count") == batches + 2  # the hung-up requests never decoded
        assert server.metric("aiayn_errors_total", kind="client_gone") >= 3
    finally:
        server.stop()


# --------------------------------------------------------------------------- no text in the server log


def test_unknown_characters_are_counted_in_the_server_log_never_quoted(server):
    r = httpx.post(f"{server.url}/translate", json={"sentences": ["a \u2603\u2603 man", "two dogs \u0416\u0416"]}, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.json()["request_id"]
    time.sleep(0.3)
    text = server.text()
    assert f"request {rid}: 2 of 2 line(s) held 2 run(s)" in text, text[-2000:]
    assert "\u2603" not in text and "\u0416" not in text and "two dogs" not in text
    logged = sqlite3.connect(server.db).execute("SELECT source FROM sentences WHERE request_id = ?", (rid,)).fetchall()
    assert [s for (s,) in logged] == ["a \u2603\u2603 man", "two dogs \u0416\u0416"]  # the text lives here only


# --------------------------------------------------------------------------- a body that never ends


def _stalled_upload(port: int) -> socket.socket:
    """A connection that sends the headers of a 1,000-byte body and one byte of it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{")
    return s


def _status(s: socket.socket) -> int | None:
    """The HTTP status the server answered on ``s`` (None: it closed without an answer)."""
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    m = re.match(rb"HTTP/1\.1 (\d{3})", data)
    return int(m.group(1)) if m else None


def test_a_stalled_body_is_cut_after_the_read_timeout(server):
    s = _stalled_upload(server.port)
    t0 = time.monotonic()
    assert _status(s) == 408  # the default --body-timeout-s 10
    assert 9 < time.monotonic() - t0 < 25
    s.close()


def test_sigterm_cuts_stalled_uploads_and_answers_requests_in_flight(world, tmp_path):
    """50 stalled uploads and one request decoding, then SIGTERM: the uploads get 503 at once, the
    request its answer (logged), and the process exits well within its drain (not after it)."""
    s = ServeProcess(world["bundle"], tmp_path, "--body-timeout-s", "60", "--drain-s", "30")
    try:
        stalled = [_stalled_upload(s.port) for _ in range(50)]
        answer: list[httpx.Response] = []
        busy = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{s.url}/translate", json={"sentences": world["en"], "beam_size": 8}, timeout=300)))
        busy.start()
        deadline = time.monotonic() + 60  # the uploads wait in their read, the request is decoding
        while s.metric("aiayn_requests_decoding") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        statuses = [_status(c) for c in stalled]
        busy.join(120)
        rc = s.proc.wait(120)
        took = time.monotonic() - t0
    finally:
        s.stop()
    assert statuses == [503] * 50
    assert answer and answer[0].status_code == 200 and len(answer[0].json()["translations"]) == 64
    assert rc in (0, -signal.SIGTERM) and took < 20, (rc, took, s.text()[-2000:])
    assert sqlite3.connect(s.db).execute("SELECT count(*) FROM requests").fetchone()[0] == 1


# --------------------------------------------------------------------------- retention and a failed prune


def test_retention_runs_on_its_own_timer_and_a_failed_prune_rolls_back(world, tmp_path):
    """``--retention-days 0.00003`` (2.6 s) with ``--poll-s 0``: rows are pruned on the retention
    timer. A prune that fails (a trigger raising on DELETE, as a full disk would) is rolled back and
    logged once; requests keep being answered and logged; another writer is not locked out; once
    the trigger is gone the rows go, and their text is not left in the database or its WAL."""
    s = ServeProcess(world["bundle"], tmp_path, "--retention-days", "0.00003")
    try:
        other = sqlite3.connect(s.db, timeout=5)  # the schema is there once serve is ready
        other.execute("CREATE TRIGGER no_delete BEFORE DELETE ON sentences BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        other.commit()
        first = httpx.post(f"{s.url}/translate", json={"sentences": ["a man qzqzmarker"]}, timeout=60)
        assert first.status_code == 200
        # the first request turns prunable after 2.6 s; wait for the timer to fail on it twice (each a tick)
        wait_for(lambda: s.metric("aiayn_log_prune_failures_total") >= 2, 120, "the timer failing to prune twice",
                 interval_s=0.2)
        again = httpx.post(f"{s.url}/translate", json={"sentences": ["a dog qzqzmarker"]}, timeout=60)
        assert again.status_code == 200, again.text
        other.execute("DROP TRIGGER no_delete")  # not locked out by a half-open transaction
        other.commit()
        other.close()
        wait_for(lambda: not s.rows(), 60, "the rows older than the retention pruned", interval_s=0.2)
        wait_for(lambda: "pruning works again" in s.text(), 30, "'pruning works again' in the server log",
                 interval_s=0.2)
        text = s.text()
    finally:
        s.stop()
    assert len(re.findall(r"pruning rows older than .* failed and was rolled back", text)) == 1, text[-3000:]
    assert "pruning works again" in text and "Traceback" not in text
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("requests.db*"))
    assert b"qzqzmarker" not in stored


# --------------------------------------------------------------------------- the port is taken


def test_a_taken_port_is_one_line_and_exit_2_before_the_model_loads(world, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        t0 = time.monotonic()
        proc = subprocess.run([str(BIN / "aiayn"), "serve", "--bundle", str(world["bundle"]), "--port", str(port),
                               "--log-path", str(tmp_path / "requests.db")], capture_output=True, text=True,
                              timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        taken.close()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "requests.db").exists()  # nothing was opened, no model loaded
    assert time.monotonic() - t0 < 60
