"""Progress people expect: a rich bar on a terminal, a log line with the ETA every N units otherwise.

``Progress(label, total, every=N)`` is a context manager; ``advance(n, info)`` / ``update(done, info)``
move it. On a terminal (``sys.stderr.isatty()``) it is a rich bar with done/total, elapsed time, the
estimated time left and ``info``; without one (CI, ``dvc repro`` in a log, Prefect) it logs
``label unit done/total info ETA h:mm:ss`` every ``every`` units (and at the end). The ETA is the mean time per
unit since the first update times the units left (``eta_seconds``). Nothing here changes an output:
stages hand it their counts.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["Progress", "eta_seconds", "format_seconds"]

log = logging.getLogger("aiayn")


def eta_seconds(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left at the mean rate so far: ``elapsed / done * (total - done)``; None before any progress."""
    if done <= 0 or elapsed <= 0:
        return None
    return max(total - done, 0.0) * elapsed / done


def format_seconds(seconds: float | None) -> str:
    """``1:02:03`` / ``4:05`` (h:mm:ss or m:ss); ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """A progress display over ``total`` units (steps, sentences) named ``label``.

    Args:
        label: what is counted ("train", "evaluate test_2016_flickr").
        total: units in all (> 0).
        every: without a terminal, log a line every this many units (>= 1).
        terminal: force the rich bar (True) or log lines (False); default: ``sys.stderr.isatty()``.
        unit: the unit's name in log lines ("step": ``train step 25/2600 ...``).
    """

    def __init__(self, label: str, total: int, *, every: int = 1, terminal: bool | None = None,
                 unit: str = "") -> None:
        self.label, self.total, self.every = label, max(int(total), 1), max(int(every), 1)
        self.unit = unit
        self.done, self.info = 0, ""
        self._start: float | None = None
        self._first_done = 0
        self._last_logged = 0
        self.bar: Any = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self.bar = RichProgress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                    transient=False)
            self.task = self.bar.add_task(label, total=self.total, info="")

    def __enter__(self) -> "Progress":
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.stop()
        elif self.done > self._last_logged:
            self._log()

    def eta(self) -> float | None:
        """Seconds left (``eta_seconds`` over the units done since the first update of this process)."""
        if self._start is None:
            return None
        return eta_seconds(self.done - self._first_done, self.total - self._first_done, time.perf_counter() - self._start)

    def update(self, done: int, info: str = "") -> None:
        """Set the units done (e.g. the training step) and the text shown after the bar."""
        if self._start is None:  # a resumed run: rate and ETA from where this process started
            self._start, self._first_done = time.perf_counter(), done
        self.done, self.info = done, info
        if self.bar:
            self.bar.update(self.task, completed=done, info=info)
        elif done // self.every > self._last_logged // self.every or done >= self.total:
            self._log()

    def advance(self, n: int = 1, info: str = "") -> None:
        """Add ``n`` units done."""
        if self._start is None:
            self._start, self._first_done = time.perf_counter(), self.done
        self.update(self.done + n, info or self.info)

    def _log(self) -> None:
        self._last_logged = self.done
        log.info("%s %s%d/%d %s ETA %s", self.label, f"{self.unit} " if self.unit else "", self.done, self.total,
                 self.info, format_seconds(self.eta()))
