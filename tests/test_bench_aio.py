"""benchmarks/bench_aio.py's hand-off measure, on a hand-made timeline: no server, no timing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_aio
import contention
from contention import Section


def test_handoff_is_measured_from_the_release_call_so_never_negative() -> None:
    sections = [
        # The holder calls release() at 20; its reply is read only at 30, after the waiter's
        # acquire() returned at 26 (from the release returning, that hand-off was -4).
        Section(1, 0, 10, 20, 30),
        Section(2, 5, 26, 40, 41),
        Section(2, 45, 46, 50, 52),  # same owner again: no hand-off
        Section(3, 60, 62, 70, 71),  # asked after the release began: not a hand-off
    ]
    assert contention.handoff_latencies(sections, 0, 100) == [-4]
    assert bench_aio.handoff_latencies(sections, 0, 100) == [6]
    assert bench_aio.handoff_latencies(sections, 30, 100) == []  # outside the window


def test_ratios_pair_each_window_with_the_reference_window_of_its_cycle() -> None:
    # The machine slows down 2x after the first cycle: the ratio stays what it is in each cycle.
    rates = [200.0, 100.0, 100.0]
    base = [100.0, 50.0, 50.0]
    assert bench_aio.same_cycle_ratios(rates, base) == [2.0, 2.0, 2.0]
    assert bench_aio.same_cycle_ratios([10.0], [0.0]) == []  # an empty reference window
