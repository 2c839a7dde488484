"""The tracking server probe (``aiayn.tracking.store.http_unreachable``): a refused connection is unreachable at
once, a slow server is waited for (tries of 2, 5 and 10 s), a server that never answers is given up on.

The tests count the tries the probe makes (each try's timeout, from ``urlopen``) and let the server answer
on an event (the probe's second try starting), not after a pause; elapsed time is asserted only where it
is the claim: a try waits its configured timeout (a lower bound from the configuration), and a probe
that gets no answer gives up (an upper bound scaled by the measured host factor, ``support.host_speed``).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from support.host_speed import scaled
from support.services import free_port

from aiayn.tracking.store import _HEALTH_TIMEOUTS_S, http_unreachable


@pytest.fixture
def tries(monkeypatch) -> list[float]:
    """The timeout of every try ``http_unreachable`` makes, in order (``urlopen`` wrapped, still called)."""
    made: list[float] = []
    real = urllib.request.urlopen

    def counted(url, *args, timeout=None, **kwargs):
        made.append(timeout)
        return real(url, *args, timeout=timeout, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", counted)
    return made


class _HeldHealth:
    """A local HTTP server that answers every request once ``release`` is set, and holds it until then
    (a loaded tracking server: a try made before the release times out)."""

    def __init__(self, release: threading.Event) -> None:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                release.wait(300)  # bounds a hang only
                try:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"OK")
                except OSError:  # the try that timed out has hung up
                    pass

            def log_message(self, *args) -> None:
                pass

        self.release = release
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_slow_tracking_server_is_waited_for_not_turned_off(tries, monkeypatch) -> None:
    """/health not answered within the first try (2 s), answered on the second: the 2 s try times out,
    the 5 s try gets it, tracking stays on. (The single 2 s probe this replaced called it unreachable
    and turned tracking off for the whole stage.) The server answers once the second try has started,
    so "the first times out, the second gets it" holds on any host."""
    release = threading.Event()
    slow = _HeldHealth(release)
    real = urllib.request.urlopen

    def release_on_second_try(url, *args, **kwargs):
        if tries:  # a try was made (and timed out): the server answers from now on
            release.set()
        return real(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", release_on_second_try)  # around the counting wrapper
    try:
        t0 = time.monotonic()
        assert http_unreachable(f"http://127.0.0.1:{slow.port}") is None
        took = time.monotonic() - t0
    finally:
        slow.close()
    assert tries == list(_HEALTH_TIMEOUTS_S[:2])  # the first try timed out, the second was answered
    assert took >= _HEALTH_TIMEOUTS_S[0]  # the first try waited its whole timeout


def test_a_server_that_never_answers_is_unreachable_after_the_last_try_and_refused_at_once(tries) -> None:
    mute = socket.socket()  # accepts connections (the kernel's backlog), never reads or answers
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    timeouts = (0.2, 0.4)
    try:
        t0 = time.monotonic()
        why = http_unreachable(f"http://127.0.0.1:{mute.getsockname()[1]}", timeouts_s=timeouts)
        took = time.monotonic() - t0
    finally:
        mute.close()
    assert why is not None and "no answer in 0.4 s" in why, why
    assert tries == list(timeouts)  # every try made, each timed out
    assert took >= sum(timeouts), took  # each waited its configured timeout ...
    assert took < sum(timeouts) + scaled(2.0), took  # ... and then it gave up
    tries.clear()
    why = http_unreachable(f"http://127.0.0.1:{free_port()}", timeouts_s=(5.0, 5.0))
    # refused: the answer at once, from the first try (no timeout waited for, no retry)
    assert why is not None and "unreachable" in why and "Connection refused" in why, why
    assert tries == [5.0], tries
