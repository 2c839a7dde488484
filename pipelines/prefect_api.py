"""Prefect's temporary API server, kept out of the terminal's reach.

With no ``PREFECT_API_URL``, Prefect starts a temporary API server as a child process of the first
process that runs a flow (``prefect.server.api.server.SubprocessASGIServer``), in that process's
process group. A terminal's Ctrl-C (SIGINT to the whole foreground group), ``kill -INT -PGID`` or a
supervisor's group SIGTERM then stop that server at the same moment as the stage. The stage stops
cleanly (the trainer saves its checkpoint), but its flow cannot report the ending to an API that is
gone, and Prefect's at-exit drain of undelivered events then waits for ever: the stage hung instead
of exiting 130 (``tests/test_pipelines.py::test_stage_from_a_bare_environment_then_ctrl_c_in_train``,
``group``).

``keep_temporary_api_out_of_the_group`` makes Prefect start that server in a session of its own
(``start_new_session``), so group signals reach the flow's process only; Prefect still stops the
server at exit (``atexit``, SIGTERM). On Linux the server also gets SIGTERM when the process that
started it dies (``PR_SET_PDEATHSIG``), so a SIGKILLed stage leaves no server behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["keep_temporary_api_out_of_the_group"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent_fn(parent: int):
    """A ``preexec_fn`` for Linux: SIGTERM the child when its parent dies (and at once if it already has).

    ``prctl`` is looked up here, in the parent, so the forked child calls one C function and
    nothing that could take a lock another thread of the parent held at ``fork``."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody is left to stop us
            os._exit(1)

    return preexec


class _OwnSessionSubprocess:
    """The ``subprocess`` module as Prefect's server module sees it, with ``Popen`` starting its
    child in a new session (and, on Linux, tied to the life of the main thread that starts it)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def Popen(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the name Prefect calls
        kwargs.setdefault("start_new_session", True)
        # PR_SET_PDEATHSIG fires when the *thread* that forked dies: only the main thread lives as long
        # as the process (Prefect starts the server from there when a flow run begins).
        if sys.platform == "linux" and threading.current_thread() is threading.main_thread():
            kwargs.setdefault("preexec_fn", _die_with_parent_fn(os.getpid()))
        return self._module.Popen(*args, **kwargs)


def keep_temporary_api_out_of_the_group() -> bool:
    """When Prefect would start a temporary API server (no API URL configured), make it start that
    server in its own session. Returns True when the temporary server's module was set up so (now or
    before), False when an API URL is configured (a real server: nothing to start). Idempotent.

    Import cost: ``prefect.settings``; in the temporary-server case also Prefect's server module,
    which that case imports anyway to start the server."""
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return False
    from prefect.server.api import server

    if not isinstance(server.subprocess, _OwnSessionSubprocess):
        server.subprocess = _OwnSessionSubprocess(server.subprocess)
    return True
