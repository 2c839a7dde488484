"""The tracking server probe (``aiayn.tracking.store.http_unreachable``): a refused connection is unreachable at
once, a slow server is waited for (tries of 2, 5 and 10 s), a server that never answers is given up on."""

from __future__ import annotations

import socket
import time

from support.services import free_port

from aiayn.tracking.store import http_unreachable


class _SlowHealth:
    """A local HTTP server whose every answer takes ``delay_s`` (a loaded tracking server); ``accept_only``:
    it accepts connections and never answers."""

    def __init__(self, delay_s: float, accept_only: bool = False) -> None:
        import http.server
        import threading

        delay = delay_s

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                time.sleep(delay)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *args) -> None:
                pass

        if accept_only:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(8)
            self.port, self.server = self.sock.getsockname()[1], None
        else:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self.port = self.server.server_address[1]
            threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        else:
            self.sock.close()


def test_a_slow_tracking_server_is_waited_for_not_turned_off() -> None:
    """/health answered in 3 s (a busy server): the 2 s try times out, the 5 s try gets it, tracking stays on.
    (The single 2 s probe this replaced called it unreachable and turned tracking off for the whole stage.)"""
    slow = _SlowHealth(3.0)
    try:
        t0 = time.monotonic()
        assert http_unreachable(f"http://127.0.0.1:{slow.port}") is None
        assert 2.5 < time.monotonic() - t0 < 30
    finally:
        slow.close()


def test_a_server_that_never_answers_is_unreachable_after_the_last_try_and_refused_at_once() -> None:
    mute = _SlowHealth(0.0, accept_only=True)
    try:
        t0 = time.monotonic()
        why = http_unreachable(f"http://127.0.0.1:{mute.port}", timeouts_s=(0.2, 0.4))
        assert why is not None and "no answer in 0.4 s" in why, why
        assert 0.5 < time.monotonic() - t0 < 10
    finally:
        mute.close()
    t0 = time.monotonic()
    why = http_unreachable(f"http://127.0.0.1:{free_port()}", timeouts_s=(5.0, 5.0))
    assert why is not None and "unreachable" in why and time.monotonic() - t0 < 4.0, why  # no retry when refused
