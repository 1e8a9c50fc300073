"""Latency statistics and the one measurement record every scenario returns."""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Measurement:
    """One timed run of one scenario for one peer.

    `operations` counted units of work (acquire+release pairs for the lock scenarios) done in
    `elapsed_ns` of wall-clock time; `latencies_ns` has one entry per operation when the scenario
    times them one by one.
    """

    operations: int
    elapsed_ns: int
    latencies_ns: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.operations * 1e9 / self.elapsed_ns if self.elapsed_ns > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "elapsed_s": round(self.elapsed_ns / 1e9, 6),
            "per_second": round(self.per_second, 1),
            "latency_us": latency_summary(self.latencies_ns),
            **self.extra,
        }


def percentile(sorted_values: Sequence[int], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(round(q * len(sorted_values) / 100.0, 9))))
    return float(sorted_values[rank - 1])


def latency_summary(latencies_ns: Sequence[int]) -> dict[str, float] | None:
    """p50/p90/p99/p99.9/max/mean in microseconds, or None when nothing was timed."""
    if not latencies_ns:
        return None
    values = sorted(latencies_ns)
    return {
        "count": len(values),
        "p50": round(percentile(values, 50) / 1e3, 1),
        "p90": round(percentile(values, 90) / 1e3, 1),
        "p99": round(percentile(values, 99) / 1e3, 1),
        "p99_9": round(percentile(values, 99.9) / 1e3, 1),
        "max": round(values[-1] / 1e3, 1),
        "mean": round(statistics.fmean(values) / 1e3, 1),
    }


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect once, then keep the cyclic GC out of the timed region (as timeit does)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
