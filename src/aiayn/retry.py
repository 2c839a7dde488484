"""Which I/O failures are worth retrying: one rule for the core's downloads and the Prefect ``io_task``.

Transient (retried): connection errors, timeouts, HTTP 5xx and 429, URL errors
without an HTTP status (DNS failure, refused or reset connection), and a plain
``OSError`` whose ``errno`` is a network one (``TRANSIENT_ERRNOS``).

Permanent (never retried; the error reaches the user at once): HTTP 4xx other
than 429, a full disk (``ENOSPC``), permission errors (``EACCES``, ``EPERM``),
a missing file (``ENOENT``), a read-only file system (``EROFS``), any other
``OSError`` and every non-I/O exception.
"""

from __future__ import annotations

import errno
import socket
import urllib.error

__all__ = ["TRANSIENT_ERRNOS", "is_transient"]

#: ``errno`` values of an ``OSError`` that mean "the network or the other side failed, try again".
TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.EHOSTDOWN, errno.EPIPE, errno.EAGAIN,
})


def is_transient(exc: BaseException | None) -> bool:
    """True when ``exc`` is a transient I/O failure (see the module docstring); ``None`` -> False."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
        return True
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, OSError):
            return reason.errno is None or is_transient(reason)
        return True  # e.g. "no host given", DNS: "[Errno -2] Name or service not known" arrives as OSError
    if isinstance(exc, socket.gaierror):
        return True
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS
    return False
