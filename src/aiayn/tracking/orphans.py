"""Stage runs whose process died: ended as ``KILLED`` by the next stage run that starts.

A stage killed outright (``kill -9``, the kernel's OOM killer, a power cut) never leaves its ``with``
block, so its MLflow run would stay ``RUNNING`` for ever. Every stage run is tagged with the process
that opened it (``PROCESS_TAG``: host name, pid and the process's start time, so a reused pid is not
mistaken for it), and before a stage creates its run, ``end_orphaned_runs`` ends every ``RUNNING``
stage run of the experiment whose process is gone from this host. A run of another host, or of a
process still running (a stage of a DVC experiment queued beside this one), is left as it is.

The pipeline (parent) run a killed stage leaves open is ended by ``aiayn.tracking.parent``'s rule (a
new pipeline run supersedes it) or by the ``pipeline`` flow that owns it.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

__all__ = ["PROCESS_TAG", "process_tag", "process_gone", "end_orphaned_runs"]

log = logging.getLogger("aiayn.tracking")

#: The tag naming a stage run's process: ``<host> <pid> <start time>`` (start time in clock ticks since
#: boot, from ``/proc/<pid>/stat``; empty where there is no ``/proc``).
PROCESS_TAG = "aiayn.process"


def _start_time(pid: int) -> str:
    """Process ``pid``'s start time (``/proc/<pid>/stat`` field 22), or "" when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return ""


def process_tag(pid: int | None = None) -> str:
    """``PROCESS_TAG``'s value for process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()} {pid} {_start_time(pid)}".rstrip()


def process_gone(tag: str) -> bool:
    """True when the process ``tag`` names ran on this host and runs no more (no such pid, or the pid now
    belongs to a process that started at another time); False for another host's, or a malformed tag."""
    parts = tag.split(" ")
    if len(parts) not in (2, 3) or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): compare start times below
        pass
    return len(parts) == 3 and _start_time(pid) not in ("", parts[2])


def end_orphaned_runs(client: Any, experiment_id: str) -> list[str]:
    """End as ``KILLED`` every ``RUNNING`` stage run of ``experiment_id`` whose process is gone
    (``process_gone``); return their run ids."""
    running = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000)
    ended = []
    for run in running:
        tag = run.data.tags.get(PROCESS_TAG)
        if tag and process_gone(tag):
            client.set_terminated(run.info.run_id, status="KILLED")
            ended.append(run.info.run_id)
            log.warning("MLflow run %s (stage %s) ended as KILLED: its process (%s) is gone", run.info.run_id,
                        run.data.tags.get("aiayn.stage", "?"), tag)
    return ended
