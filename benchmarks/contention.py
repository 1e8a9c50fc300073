"""What a multi-process run recorded, and what follows from it: pure functions, no I/O.

Every contender records one row per critical section, with `time.perf_counter_ns()` (on Linux
CLOCK_MONOTONIC, one clock for every process of the machine, so rows of different processes
compare directly):

    owner       who held it (worker index * 1000 + thread index)
    acq_start   acquire() called
    acq_end     acquire() returned (the section starts)
    rel_start   release() called (the section ends)
    rel_end     release() returned
"""

from __future__ import annotations

import itertools
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

FIELDS = 5  # integers per recorded section


@dataclass(frozen=True)
class Section:
    owner: int
    acq_start: int
    acq_end: int
    rel_start: int
    rel_end: int

    @property
    def wait_ns(self) -> int:
        return self.acq_end - self.acq_start


def encode(rows: Sequence[int]) -> bytes:
    """A flat sequence of FIELDS integers per section, as bytes for a pipe."""
    return array("q", rows).tobytes()


def decode(buffers: Iterable[bytes]) -> list[Section]:
    """Every section of every buffer, ordered by the moment the section started (acq_end)."""
    sections: list[Section] = []
    for buffer in buffers:
        values = array("q")
        values.frombytes(buffer)
        for i in range(0, len(values) - FIELDS + 1, FIELDS):
            sections.append(Section(*values[i : i + FIELDS]))
    sections.sort(key=lambda s: (s.acq_end, s.rel_start))
    return sections


def max_concurrent(sections: Sequence[Section]) -> int:
    """The most sections that were held at one moment (a lock must never exceed 1).

    A section is held from acquire() returning to release() being called; at equal times a
    release counts before an acquire, so a clean hand-off is not an overlap.
    """
    events = [(s.acq_end, 1) for s in sections] + [(s.rel_start, -1) for s in sections]
    events.sort()
    held = peak = 0
    for _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


def handoff_latencies(sections: Sequence[Section], start_ns: int, end_ns: int) -> list[int]:
    """ns from the holder's release() returning to the next holder's acquire() returning.

    Counted only where the next holder is another contender that was already waiting when the
    release began (its acquire() was called before release() was), and that took over inside
    the window. Negative values are possible and kept: the waiter may get the lock before the
    releaser has read its own reply.
    """
    out = []
    for before, after in itertools.pairwise(sections):
        if (
            after.owner != before.owner
            and after.acq_start <= before.rel_start
            and start_ns <= after.acq_end <= end_ns
        ):
            out.append(after.acq_end - before.rel_end)
    return out


def owner_switches(sections: Sequence[Section]) -> int:
    """How many consecutive sections (in start order) were held by different contenders."""
    return sum(1 for a, b in itertools.pairwise(sections) if a.owner != b.owner)


def contended_summary(
    sections: Sequence[Section], start_ns: int, end_ns: int, capacity: int | None
) -> dict[str, Any]:
    """Throughput, owner switches, waits and exclusion for the window [start_ns, end_ns].

    Throughput and owner switches count the sections that started inside the window; the
    longest wait is over every acquire() called inside the window, including those that were
    only served after it (a starved contender shows up there, not in the throughput).
    """
    window = [s for s in sections if start_ns <= s.acq_end <= end_ns]
    requested = [s for s in sections if start_ns <= s.acq_start <= end_ns]
    seconds = (end_ns - start_ns) / 1e9
    per_owner = Counter(s.owner for s in window)
    waits = [s.wait_ns for s in requested]
    peak = max_concurrent(sections)
    return {
        "sections": len(window),
        "per_second": len(window) / seconds if seconds > 0 else 0.0,
        "owner_switch_pct": (
            100.0 * owner_switches(window) / (len(window) - 1) if len(window) > 1 else None
        ),
        "longest_wait_ms_max": max(waits) / 1e6 if waits else None,
        "wait_ns": waits,
        "contenders_served": len(per_owner),
        "sections_per_contender_min": min(per_owner.values()) if per_owner else 0,
        "sections_per_contender_max": max(per_owner.values()) if per_owner else 0,
        "max_holders_max": peak,
        "capacity": capacity,
        "exclusion_violated": capacity is not None and peak > capacity,
    }
