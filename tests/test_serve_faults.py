"""``aiayn serve`` against hostile and broken clients: real ``aiayn serve`` processes on free
loopback ports, each case as a client would meet it.

Hostile JSON (a 5,000-digit number, 1,000 and 50,000 nested arrays, a lone surrogate), one giant
request while ``/health`` is watched, a client that hangs up mid-decode, unknown characters (the
server log holds counts and ids, never text), a stalled body, retention on its own timer with a
prune that fails, SIGTERM with 50 stalled uploads and a request in flight, and a taken port.

Each test waits on the server's own state (its metrics, its log, its sockets' receive queues, the
request log) with a deadline that only bounds a hang (``HANG_S``); the two claims that are about
time (``/health`` answers promptly, the body timeout fires) take their lower bound from the
configuration and scale their upper bound by the measured host factor (``support.host_speed``).
"""

from __future__ import annotations

import json
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
from support.host_speed import scaled  # noqa: E402
from support.services import wait_for  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402

BIN = Path(sys.executable).parent
OPTIONS = DecodeOptions(beam_size=2, max_len_a=1.0, max_len_b=6)
#: Deadlines that only bound a hang (a test waits on an event or a state, never on elapsed time).
HANG_S = 300


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
        deadline = time.monotonic() + HANG_S
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
        for line in httpx.get(f"{self.url}/metrics", timeout=HANG_S).text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def rows(self) -> int:
        return sqlite3.connect(self.db, timeout=HANG_S).execute("SELECT count(*) FROM sentences").fetchone()[0]

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


def post_raw(url: str, body: bytes, timeout: float = HANG_S) -> httpx.Response:
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
    is checked first, in one tokenizer pass, off the event loop, so the request is refused with
    nothing prepared, decoded or logged (the counters say so, not a stopwatch); /health keeps
    answering meanwhile. How long a /health answer may take is the one bound in time here, written
    for the fastest host and scaled by the measured host factor (``support.host_speed``)."""
    bound = scaled(2.0)  # measured (once per process) before the request
    before = {"too_many_tokens": server.metric("aiayn_errors_total", kind="too_many_tokens"),
              "batches": server.metric("aiayn_batch_sentences_count"), "tokens_in": server.metric("aiayn_tokens_in_total"),
              "rows": server.rows()}
    answer: list[httpx.Response] = []
    big = threading.Thread(target=lambda: answer.append(post_raw(server.url, b'{"sentences":["' + b"a" * 250_000 + b'"]}')))
    big.start()
    worst, answered = 0.0, 0
    with httpx.Client(base_url=server.url, timeout=HANG_S) as c:
        while big.is_alive() or not answered:
            t = time.monotonic()
            assert c.get("/health").json() == {"status": "alive"}
            worst = max(worst, time.monotonic() - t)
            answered += 1
            time.sleep(0.02)
    big.join()
    assert answer[0].status_code == 422 and "source tokens" in answer[0].json()["detail"], answer[0].text
    assert answer[0].json()["error"] == "too_many_tokens"  # the limit refused it, not a later step
    assert server.metric("aiayn_errors_total", kind="too_many_tokens") == before["too_many_tokens"] + 1
    assert server.metric("aiayn_batch_sentences_count") == before["batches"]  # nothing decoded
    assert server.metric("aiayn_tokens_in_total") == before["tokens_in"] and server.rows() == before["rows"]  # nor logged
    assert worst < bound, f"/health took {worst:.2f} s while the request was prepared (bound {bound:.1f} s)"


# --------------------------------------------------------------------------- the client hangs up


def _send_request(port: int, body: bytes) -> socket.socket:
    """A connection that has sent a whole ``POST /translate`` with ``body`` and waits for the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
    s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def test_a_client_that_hangs_up_is_neither_decoded_on_nor_logged(world, tmp_path):
    """Three clients (a client retrying) send 64 sentences at beam 8 while the one decoding worker is
    busy with another request (2048 sentences), and hang up once their requests wait in the queue:
    their requests leave the queue undecoded (the server's batch count grows by the busy request's and
    the patient one's only) and unlogged, so the drift window holds no duplicates; then one patient
    request is logged exactly once.

    Every step waits on the server's own state, never on a clock: the busy request decoding (its batch
    counted), the three queued behind it (``aiayn_requests_decoding`` = 4), their hang-ups counted
    (499) while the batch count has not moved. (An older version hung up with 0.2 s client timeouts
    and needed the 2048 sentences to outlast them.) The busy request must still be decoding when the
    hang-ups are counted: it has 2048 sentences at beam 8 against the hang-ups' few socket writes, on
    the same host (if it ever ended first, the batch count says so)."""
    busy_body = {"sentences": [s for _ in range(32) for s in world["en"]], "beam_size": 8}
    server = ServeProcess(world["bundle"], tmp_path, "--max-sentences", str(len(busy_body["sentences"])),
                          "--max-body-bytes", str(1 << 20), "--max-request-tokens", str(1 << 20))
    try:
        rows, gone = server.rows(), server.metric("aiayn_requests_total", status="499")
        batches = server.metric("aiayn_batch_sentences_count")
        result: dict = {}
        busy = threading.Thread(target=lambda: result.update(r=httpx.post(f"{server.url}/translate", json=busy_body,
                                                                           timeout=HANG_S)))
        busy.start()
        wait_for(lambda: server.metric("aiayn_batch_sentences_count") > batches or not busy.is_alive(), HANG_S,
                 "the busy request's decoding", interval_s=0.05)
        assert busy.is_alive(), f"the busy request ended first: {result['r'].status_code} {result['r'].text[:300]}"
        body = json.dumps({"sentences": world["en"], "beam_size": 8}).encode()
        clients = [_send_request(server.port, body) for _ in range(3)]
        wait_for(lambda: server.metric("aiayn_requests_decoding") >= 4, HANG_S,
                 "the three requests queued behind the busy one", interval_s=0.05)
        for c in clients:  # the clients hang up
            c.close()
        wait_for(lambda: server.metric("aiayn_requests_total", status="499") >= gone + 3, HANG_S,
                 "the server noticing the three clients hang up", interval_s=0.05)
        # the busy request's batch only: none of the three was taken from the queue
        assert server.metric("aiayn_batch_sentences_count") == batches + 1, (
            "a hung-up request was decoded" + ("" if busy.is_alive() else
                                               " (the busy request had ended: give it more sentences)"))
        busy.join(HANG_S)
        assert result["r"].status_code == 200 and len(result["r"].json()["translations"]) == len(busy_body["sentences"])
        assert server.rows() == rows + len(busy_body["sentences"])
        r = httpx.post(f"{server.url}/translate", content=body, headers={"content-type": "application/json"},
                       timeout=HANG_S)
        assert r.status_code == 200 and len(r.json()["translations"]) == 64
        assert server.rows() == rows + len(busy_body["sentences"]) + 64
        assert server.metric("aiayn_batch_sentences_count") == batches + 2  # the hung-up requests never decoded
        assert server.metric("aiayn_errors_total", kind="client_gone") >= 3
    finally:
        server.stop()


# --------------------------------------------------------------------------- no text in the server log


def test_unknown_characters_are_counted_in_the_server_log_never_quoted(server):
    r = httpx.post(f"{server.url}/translate", json={"sentences": ["a \u2603\u2603 man", "two dogs \u0416\u0416"]},
                   timeout=HANG_S)
    assert r.status_code == 200, r.text
    rid = r.json()["request_id"]
    line = f"request {rid}: 2 of 2 line(s) held 2 run(s)"
    wait_for(lambda: line in server.text(), HANG_S, f"{line!r} in the server log", interval_s=0.05)
    text = server.text()
    assert "\u2603" not in text and "\u0416" not in text and "two dogs" not in text
    logged = sqlite3.connect(server.db).execute("SELECT source FROM sentences WHERE request_id = ?", (rid,)).fetchall()
    assert [s for (s,) in logged] == ["a \u2603\u2603 man", "two dogs \u0416\u0416"]  # the text lives here only


# --------------------------------------------------------------------------- a body that never ends


def _stalled_upload(port: int) -> socket.socket:
    """A connection that sends the headers of a 1,000-byte body and one byte of it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
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
    """The default ``--body-timeout-s`` (10 s) is the claim: the 408 comes no sooner than the configured
    timeout (counted from before the connection opened, so that bound is exact on any host), and not
    forever: the time past the timeout is bounded for the fastest host and scaled by the measured
    host factor (``support.host_speed``)."""
    from aiayn.serving.config import ServeConfig

    timeout_s = ServeConfig().body_timeout_s  # the server fixture runs on the defaults
    bound = timeout_s + scaled(15.0)  # measured (once per process) before the clock starts
    before = server.metric("aiayn_errors_total", kind="body_timeout")
    t0 = time.monotonic()
    s = _stalled_upload(server.port)
    try:
        s.settimeout(max(HANG_S, bound + 60))  # the answer's wait itself never decides the outcome
        assert _status(s) == 408
        took = time.monotonic() - t0
    finally:
        s.close()
    assert server.metric("aiayn_errors_total", kind="body_timeout") == before + 1
    assert took >= timeout_s, f"cut after {took:.2f} s, before the configured {timeout_s:g} s"
    assert took < bound, f"cut after {took:.1f} s (configured {timeout_s:g} s, bound {bound:.1f} s)"


def _unread_by_server(port: int, clients: list[socket.socket]) -> int | None:
    """Bytes the server on ``port`` has not read yet from these clients' connections (the receive queue
    of its side, ``/proc/net/tcp``); None while any of them is not listed yet."""
    mine = {c.getsockname()[1] for c in clients}
    seen, unread = set(), 0
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if local == port and remote in mine:
            seen.add(remote)
            unread += int(fields[4].split(":")[1], 16)
    return unread if seen == mine else None


def test_sigterm_cuts_stalled_uploads_and_answers_requests_in_flight(world, tmp_path):
    """50 stalled uploads and one request decoding, then SIGTERM: the uploads get 503 at once, the
    request its answer (logged), and the process exits within its drain, not by running it out
    (uvicorn would cancel what is left and say so).

    The signal goes when the server is in that state, not after a pause: it has read what every upload
    sent (its receive queues are empty, so each waits in its body read) and the request's batch is
    decoding (512 sentences at beam 8: still decoding when the signal lands, which its log row's
    timestamp, written after decoding, confirms)."""
    busy_body = {"sentences": [s for _ in range(8) for s in world["en"]], "beam_size": 8}
    s = ServeProcess(world["bundle"], tmp_path, "--body-timeout-s", "60", "--drain-s", "30",
                     "--max-sentences", str(len(busy_body["sentences"])), "--max-body-bytes", str(1 << 20),
                     "--max-request-tokens", str(1 << 20))
    try:
        batches = s.metric("aiayn_batch_sentences_count")
        stalled = [_stalled_upload(s.port) for _ in range(50)]
        answer: list[httpx.Response] = []
        busy = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{s.url}/translate", json=busy_body, timeout=HANG_S)))
        busy.start()
        wait_for(lambda: _unread_by_server(s.port, stalled) == 0, HANG_S, "the server reading the 50 uploads' bytes",
                 interval_s=0.05)
        wait_for(lambda: s.metric("aiayn_batch_sentences_count") > batches or not busy.is_alive(), HANG_S,
                 "the request's decoding", interval_s=0.02)
        sigterm_at = time.time()
        s.proc.send_signal(signal.SIGTERM)
        statuses = [_status(c) for c in stalled]
        busy.join(HANG_S)
        rc = s.proc.wait(HANG_S)
    finally:
        for c in stalled:
            c.close()
        s.stop()
    text = s.text()
    assert statuses == [503] * 50, (statuses, text[-2000:])
    assert answer and answer[0].status_code == 200 and len(answer[0].json()["translations"]) == len(busy_body["sentences"])
    assert rc in (0, -signal.SIGTERM), (rc, text[-2000:])
    assert "timeout graceful shutdown exceeded" not in text, text[-2000:]  # the drain was not run out
    assert sqlite3.connect(s.db).execute("SELECT count(*) FROM requests").fetchone()[0] == 1
    (logged_at,) = sqlite3.connect(s.db).execute("SELECT ts FROM requests").fetchone()
    assert logged_at > sigterm_at, "the request was answered before SIGTERM: it was not in flight"


# --------------------------------------------------------------------------- retention and a failed prune


def test_retention_runs_on_its_own_timer_and_a_failed_prune_rolls_back(world, tmp_path):
    """``--retention-days 0.00003`` (2.6 s) with ``--poll-s 0``: rows are pruned on the retention
    timer. A prune that fails (a trigger raising on DELETE, as a full disk would) is rolled back and
    logged once; requests keep being answered and logged; another writer is not locked out; once
    the trigger is gone the rows go, and their text is not left in the database or its WAL."""
    s = ServeProcess(world["bundle"], tmp_path, "--retention-days", "0.00003")
    try:
        # the schema is there once serve is ready; "not locked out" below: the lock comes within a busy
        # timeout written for the fastest host, scaled by the host factor
        other = sqlite3.connect(s.db, timeout=scaled(5.0))
        other.execute("CREATE TRIGGER no_delete BEFORE DELETE ON sentences BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        other.commit()
        first = httpx.post(f"{s.url}/translate", json={"sentences": ["a man qzqzmarker"]}, timeout=HANG_S)
        assert first.status_code == 200
        # the first request turns prunable after 2.6 s; wait for the timer to fail on it twice (each a tick)
        wait_for(lambda: s.metric("aiayn_log_prune_failures_total") >= 2, HANG_S, "the timer failing to prune twice",
                 interval_s=0.2)
        again = httpx.post(f"{s.url}/translate", json={"sentences": ["a dog qzqzmarker"]}, timeout=HANG_S)
        assert again.status_code == 200, again.text
        other.execute("DROP TRIGGER no_delete")  # not locked out by a half-open transaction
        other.commit()
        other.close()
        wait_for(lambda: not s.rows(), HANG_S, "the rows older than the retention pruned", interval_s=0.2)
        wait_for(lambda: "pruning works again" in s.text(), HANG_S, "'pruning works again' in the server log",
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
        proc = subprocess.run([str(BIN / "aiayn"), "serve", "--bundle", str(world["bundle"]), "--port", str(port),
                               "--log-path", str(tmp_path / "requests.db")], capture_output=True, text=True,
                              timeout=HANG_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        taken.close()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    # "before the model loads" is what the process left, not how fast it went: one line (no start-up log,
    # no "serving ... version" line), no stdout, and no request log opened
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0], proc.stderr[-2000:]
    assert proc.stdout == "" and "serving" not in proc.stderr
    assert not (tmp_path / "requests.db").exists()  # nothing was opened, no model loaded
