"""When the ``adapt`` flow adapts, and its memory between runs.

Two triggers (``adapt.trigger``), either one enough, both counted since the last adaptation:

- the last ``drift_windows`` drift checks (``artifacts/drift/<UTC time>/summary.json``, written by
  ``aiayn monitor`` and the hourly ``drift-check`` flow) all found drift in the served inputs;
- the reviewed corpus (``adapt.reviewed_corpus``, appended to by ``aiayn review import``) grew by at
  least ``reviewed_pairs`` pairs.

The state (``.aiayn/adapt_state.json``, untracked like the pipeline's run state) records when the last
adaptation started and how many reviewed pairs it trained on, written atomically once an adaptation has
gone through the gate (promoted or not); a failed run leaves it as it was, so the next run tries again.
``adapt_lock`` keeps one adaptation per project at a time (a lock the OS releases when its process dies).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiayn.config.adaptation import AdaptTriggerConfig
from aiayn.io import atomic_write_json

__all__ = ["STATE_FILE", "LOCK_FILE", "TriggerError", "Trigger", "read_state", "write_state", "drift_summaries",
           "drift_streak", "reviewed_pairs", "check_trigger", "adapt_lock", "utc_now"]

#: The adapt flow's state, relative to the project root.
STATE_FILE = Path(".aiayn") / "adapt_state.json"
#: Held (``flock``) while an adaptation runs, relative to the project root.
LOCK_FILE = Path(".aiayn") / "adapt.lock"


class TriggerError(ValueError):
    """A state file or drift summary that cannot be read (one line naming the file)."""


@dataclass(frozen=True)
class Trigger:
    """``fire``: adapt now; ``reason``: one line saying why, or why not."""

    fire: bool
    reason: str


def utc_now() -> str:
    """Now, as the drift checks write their ``checked_at`` (ISO 8601, UTC, seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _when(value: Any, where: str) -> datetime:
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise TriggerError(f"{where}: {value!r} is not an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def read_state(root: Path) -> dict[str, Any]:
    """The last adaptation's state (``{}`` when there has been none). Raises ``TriggerError`` for a file
    that is not a JSON object."""
    path = Path(root) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise TriggerError(f"{path}: not valid JSON ({e}); delete it to start counting afresh") from None
    if not isinstance(state, dict):
        raise TriggerError(f"{path}: expected a JSON object, got {type(state).__name__}")
    return state


def write_state(root: Path, state: dict[str, Any]) -> Path:
    """Write the state atomically; returns its path."""
    path = Path(root) / STATE_FILE
    atomic_write_json(path, state)
    return path


def drift_summaries(drift_dir: Path, since: str | None = None) -> list[dict[str, Any]]:
    """The drift checks' summaries under ``drift_dir`` (``<check>/summary.json``; folders being written,
    whose names start with a dot, are skipped), oldest first by ``checked_at``, only those checked after
    ``since`` (ISO time) when given. Raises ``TriggerError`` for a summary that is not valid JSON."""
    after = _when(since, "the last adaptation's time") if since else None
    found = []
    for path in sorted(Path(drift_dir).glob("*/summary.json")):
        if path.parent.name.startswith("."):
            continue
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise TriggerError(f"{path}: not valid JSON ({e})") from None
        when = _when(summary.get("checked_at") or path.parent.name, str(path))
        if after is None or when > after:
            found.append((when, path.parent.name, summary))
    return [s for _, _, s in sorted(found, key=lambda t: t[:2])]


def drift_streak(summaries: list[dict[str, Any]], windows: int) -> Trigger:
    """Whether the last ``windows`` summaries all found drift (``verdict`` ``drift``)."""
    last = summaries[-windows:]
    if len(last) < windows:
        return Trigger(False, f"{len(summaries)} drift check(s) since the last adaptation, {windows} needed")
    drifted = sum(s.get("verdict") == "drift" for s in last)
    if drifted == windows:
        return Trigger(True, f"the last {windows} drift checks all found drift in the served inputs")
    return Trigger(False, f"{drifted} of the last {windows} drift checks found drift")


def reviewed_pairs(corpus: Path) -> int:
    """Pairs in the reviewed corpus (non-empty lines); 0 when it does not exist yet."""
    try:
        with open(corpus, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def check_trigger(cfg: AdaptTriggerConfig, *, drift_dir: Path, corpus: Path, state: dict[str, Any]) -> Trigger:
    """Adapt now? Either trigger of the module doc, counted since ``state`` (``read_state``)."""
    drift = drift_streak(drift_summaries(drift_dir, state.get("adapted_at")), cfg.drift_windows)
    have, before = reviewed_pairs(corpus), int(state.get("reviewed_pairs", 0))
    grew = have - before
    if grew >= cfg.reviewed_pairs:
        pairs = Trigger(True, f"the reviewed corpus {corpus} grew by {grew} pairs (>= {cfg.reviewed_pairs})")
    else:
        pairs = Trigger(False, f"the reviewed corpus grew by {grew} pairs, {cfg.reviewed_pairs} needed")
    fired = [t.reason for t in (drift, pairs) if t.fire]
    if fired:
        return Trigger(True, "; ".join(fired))
    return Trigger(False, f"{drift.reason}; {pairs.reason}")


@contextlib.contextmanager
def adapt_lock(root: Path) -> Iterator[bool]:
    """Hold the project's adapt lock in the block; yields False (holding nothing) when another adaptation
    holds it. An exclusive ``flock`` on ``LOCK_FILE``: the OS releases it when its holder's process ends,
    so a killed run never leaves a stale lock. The file names the holder's pid (for the skip message)."""
    path = Path(root) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
