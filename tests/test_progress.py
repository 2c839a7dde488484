"""The progress display's ETA: units left at the recent rate, so a pause does not haunt the rest of a run."""

from __future__ import annotations

import logging

import pytest

from aiayn import progress
from aiayn.progress import Progress, eta_seconds, format_seconds


class FakeClock:
    """``time.perf_counter`` stand-in: seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(progress.time, "perf_counter", fake)
    return fake


def test_eta_seconds_and_format() -> None:
    assert eta_seconds(10, 100, 20.0) == 180.0
    assert eta_seconds(0, 100, 20.0) is None and eta_seconds(5, 100, 0.0) is None
    assert eta_seconds(100, 100, 20.0) == 0.0
    assert [format_seconds(s) for s in (None, 5, 65, 3723)] == ["?", "0:05", "1:05", "1:02:03"]


def test_steady_rate_gives_units_left_times_seconds_per_unit(clock: FakeClock) -> None:
    bar = Progress("train", 100, every=1000, terminal=False)
    for step in range(1, 11):  # one step every 2 s
        clock.now += 2.0
        bar.update(step)
    assert bar.eta() == pytest.approx(90 * 2.0)


def test_a_long_pause_stops_counting_once_two_updates_follow_it(clock: FakeClock) -> None:
    """A run paused for an hour (SIGSTOP, a suspended host) at step 10 of 8000, then 2 s per step again: the ETA
    is back to 2 s per step left two updates later. The whole-run mean it replaced said ~800 h (seen: 21 h)."""
    bar = Progress("train", 8000, every=1000, terminal=False, window_s=600.0)
    for step in range(1, 11):
        bar.update(step)
        clock.now += 2.0
    clock.now += 3600.0
    bar.update(11)
    clock.now += 2.0
    bar.update(12)
    assert bar.eta() == pytest.approx((8000 - 12) * 2.0)


def test_a_short_pause_is_averaged_over_the_window_then_forgotten(clock: FakeClock) -> None:
    bar = Progress("train", 10_000, every=10_000, terminal=False, window_s=100.0)
    for step in range(1, 51):  # 1 s per step
        bar.update(step)
        clock.now += 1.0
    clock.now += 49.0  # a 50 s gap before step 51 (a validation, a pause)
    bar.update(51)
    seen_in_window = bar.eta()
    assert seen_in_window is not None and seen_in_window > (10_000 - 51) * 1.0 * 1.3  # the gap still counts
    for step in range(52, 200):
        clock.now += 1.0
        bar.update(step)
    assert bar.eta() == pytest.approx((10_000 - 199) * 1.0)  # 100 s later the gap has left the window


def test_a_resumed_run_counts_from_where_this_process_started(clock: FakeClock) -> None:
    bar = Progress("train", 8000, every=1000, terminal=False)
    bar.update(1800)  # resumed at step 1800: no rate yet
    assert bar.eta() is None
    clock.now += 3.0
    bar.update(1801)
    assert bar.eta() == pytest.approx((8000 - 1801) * 3.0)


def test_advance_counts_from_entering_the_block_and_the_log_line_carries_the_eta(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """Stages ``advance`` after each piece of work, so the first piece's time counts from entering the block
    (not from the first ``advance``, which would make the first batch free: ETA 0:05 where 0:10 is right)."""
    clock.now += 500.0  # time before the block (building the display) is not progress
    with caplog.at_level(logging.INFO, logger="aiayn"), \
            Progress("evaluate", 40, every=10, terminal=False, unit="sentence") as bar:
        for _ in range(4):
            clock.now += 5.0  # 10 sentences per 5 s
            bar.advance(10, "test_2016_flickr")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == ["evaluate sentence 10/40 test_2016_flickr ETA 0:15",
                         "evaluate sentence 20/40 test_2016_flickr ETA 0:10"]
    assert lines[-1] == "evaluate sentence 40/40 test_2016_flickr ETA 0:00"
    assert len(lines) == 4


def test_without_eta_the_line_carries_the_elapsed_time(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """The quantize stage's phases take 0 s (a variant this host cannot build) to ~70 s (throughput): a rate over
    phases read 'ETA 0:08' with 72 s left. ``eta=False`` shows the time elapsed instead, on both displays."""
    with caplog.at_level(logging.INFO, logger="aiayn"), \
            Progress("quantize", 3, terminal=False, unit="phase", eta=False) as bar:
        bar.advance(1, "ct2-int16: skipped")
        clock.now += 70.0
        bar.advance(1, "throughput")
    assert [r.getMessage() for r in caplog.records] == ["quantize phase 1/3 ct2-int16: skipped elapsed 0:00",
                                                        "quantize phase 2/3 throughput elapsed 1:10"]
    shown = Progress("quantize", 3, terminal=True, eta=False)
    assert not any("Remaining" in type(c).__name__ for c in shown.bar.columns)
    assert any("Remaining" in type(c).__name__ for c in Progress("train", 3, terminal=True).bar.columns)
