"""Semaphore and RWLock throughput: the harness (run.py) with only those scenarios.

    .venv/bin/python benchmarks/bench_semaphore.py [--quick] [--redis URL] [other run.py options]

Runs, for redmutex only: Semaphore acquire+release uncontended (limit 4); 8 processes on a limit
of 4, fair and unfair; RWLock read acquire+release in one process and across 8 processes; and the
uncontended Lock for reference, framed by the physical limit like every run.py run.
"""

from __future__ import annotations

import sys

import run

SCENARIOS = (
    "semaphore",
    "semaphore8-fair",
    "semaphore8-unfair",
    "rwlock-read",
    "rwlock-read8",
    "uncontended",
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run.main(["--peers", "redmutex", "--scenarios", ",".join(SCENARIOS), *args])


if __name__ == "__main__":
    sys.exit(main())
