"""Progress people expect: a rich bar on a terminal, a log line with the ETA every N units otherwise.

``Progress(label, total, every=N)`` is a context manager; ``advance(n, info)`` / ``update(done, info)``
move it. On a terminal (``sys.stderr.isatty()``) it is a rich bar with done/total, elapsed time, the
estimated time left and ``info``; without one (CI, ``dvc repro`` in a log, Prefect) it logs
``label unit done/total info ETA h:mm:ss`` every ``every`` units (and at the end). The ETA is the units left
at the recent rate: the units done over the last ``window_s`` seconds (default 600), never fewer than the two
newest updates (``eta_seconds``). A whole-run mean would count a pause (a suspended host, a ``SIGSTOP``, a
slow start) for the rest of the run: one seen run showed 21 h left when 3 h were. Rich's bar keeps its own
30 s speed estimate. Nothing here changes an output: stages hand it their counts.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from typing import Any

__all__ = ["Progress", "eta_seconds", "format_seconds"]

log = logging.getLogger("aiayn")


def eta_seconds(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left at a rate of ``done`` units in ``elapsed`` seconds: ``elapsed / done * (total - done)``.

    Args:
        done: units done in the measured span; total: units left plus ``done``; elapsed: the span (seconds).

    Returns None before any progress (``done <= 0`` or ``elapsed <= 0``)."""
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
        window_s: the ETA's rate is measured over the updates of the last this many seconds (> 0).
        eta: show the ETA (default) or, for units of very unequal cost, the elapsed time instead: a rate over
            units that take from 0 to 70 s each (the quantize stage's phases) predicts nothing.
    """

    def __init__(self, label: str, total: int, *, every: int = 1, terminal: bool | None = None,
                 unit: str = "", window_s: float = 600.0, eta: bool = True) -> None:
        self.label, self.total, self.every = label, max(int(total), 1), max(int(every), 1)
        self.unit, self.window_s, self.show_eta = unit, float(window_s), eta
        self.done, self.info = 0, ""
        self._samples: deque[tuple[float, int]] = deque()  # (perf_counter seconds, units done), oldest first
        self._entered: float | None = None
        self._last_logged = 0
        self.bar: Any = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            remaining = (TextColumn("ETA"), TimeRemainingColumn()) if eta else ()
            self.bar = RichProgress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    *remaining, TextColumn("{task.fields[info]}"), transient=False)
            self.task = self.bar.add_task(label, total=self.total, info="")

    def __enter__(self) -> "Progress":
        self._entered = time.perf_counter()
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.stop()
        elif self.done > self._last_logged:
            self._log()

    def eta(self) -> float | None:
        """Seconds left at the recent rate (``eta_seconds`` over the kept updates); None until one unit is done
        after the first update of this process (a resumed run counts from where this process started)."""
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return eta_seconds(d1 - d0, self.total - d0, t1 - t0)

    def _sample(self, done: int, at: float | None = None) -> None:
        """Keep ``(at or now, done)``; forget updates older than ``window_s``, keeping at least the two newest."""
        now = time.perf_counter()
        self._samples.append((now if at is None else at, done))
        while len(self._samples) > 2 and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def update(self, done: int, info: str = "") -> None:
        """Set the units done (e.g. the training step) and the text shown after the bar."""
        self._sample(done)
        self.done, self.info = done, info
        if self.bar:
            self.bar.update(self.task, completed=done, info=info)
        elif done // self.every > self._last_logged // self.every or done >= self.total:
            self._log()

    def advance(self, n: int = 1, info: str = "") -> None:
        """Add ``n`` units done."""
        if not self._samples:  # the work before the first advance counts: from entering the block, else from here
            self._sample(self.done, at=self._entered)
        self.update(self.done + n, info or self.info)

    def _log(self) -> None:
        self._last_logged = self.done
        if self.show_eta:
            when = f"ETA {format_seconds(self.eta())}"
        else:
            when = f"elapsed {format_seconds(time.perf_counter() - self._entered if self._entered else None)}"
        log.info("%s %s%d/%d %s %s", self.label, f"{self.unit} " if self.unit else "", self.done, self.total,
                 self.info, when)
