"""The scenarios: what is timed, written once against the peer interface.

A scenario is a function `(session, context) -> Measurement` plus the capability it needs; adding
one (contended hand-off between processes, cache stampede, semaphore...) is a function and a
`register(Scenario(...))`. Every scenario warms up before it starts the clock, times with
`time.perf_counter_ns`, and keeps the cyclic GC out of the timed region.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from peers import LockHandle, Session
from timing import Measurement, gc_paused

TTL = 10.0  # seconds: every lock in the lock scenarios is taken with this lease


@dataclass(frozen=True)
class Sizes:
    pairs: int  # timed acquire+release pairs, single-thread scenarios
    warmup: int  # untimed pairs before each timed run (per thread)
    thread_pairs: int  # timed pairs per thread, threaded scenarios
    rounds: int  # each scenario x peer is run this many times, peers interleaved
    benchmark_requests: int  # requests per redis-benchmark run (physical limit)


QUICK = Sizes(pairs=5_000, warmup=500, thread_pairs=1_000, rounds=3, benchmark_requests=20_000)
DEFAULT = Sizes(
    pairs=20_000, warmup=2_000, thread_pairs=3_000, rounds=5, benchmark_requests=100_000
)


@dataclass(frozen=True)
class Context:
    namespace: str  # every key name a scenario uses starts with this (unique per run)
    sizes: Sizes
    peer: str

    def name(self, *parts: object) -> str:
        return ":".join([self.namespace, self.peer, *map(str, parts)])


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    needs: str  # the peer capability it uses
    unit: str  # what one operation is
    run: Callable[[Session, Context], Measurement]
    single_connection: bool = False  # comparable with the single-connection physical limit


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    SCENARIOS[scenario.key] = scenario
    return scenario


def _pairs(lock: LockHandle, count: int, latencies: list[int] | None) -> None:
    """`count` acquire+release pairs; with `latencies`, append each pair's duration in ns."""
    acquire, release, clock = lock.acquire, lock.release, time.perf_counter_ns
    if latencies is None:
        for _ in range(count):
            if not acquire():
                raise RuntimeError("an uncontended acquire() returned False")
            release()
        return
    append = latencies.append
    for _ in range(count):
        start = clock()
        if not acquire():
            raise RuntimeError("an uncontended acquire() returned False")
        release()
        append(clock() - start)


def uncontended(session: Session, ctx: Context) -> Measurement:
    """One thread, one name, one reused lock object: N acquire+release pairs back to back."""
    lock = session.lock(ctx.name("uncontended"), TTL)
    _pairs(lock, ctx.sizes.warmup, None)
    latencies: list[int] = []
    with gc_paused():
        start = time.perf_counter_ns()
        _pairs(lock, ctx.sizes.pairs, latencies)
        elapsed = time.perf_counter_ns() - start
    return Measurement(ctx.sizes.pairs, elapsed, latencies)


def threads_on_names(threads: int, names: int) -> Callable[[Session, Context], Measurement]:
    """`threads` threads sharing one session, thread i looping on name i % `names`.

    Each thread has its own lock object; all start timing together behind a barrier, and the
    aggregate rate is all pairs over the span from the first start to the last finish.
    """

    def run(session: Session, ctx: Context) -> Measurement:
        locks = [
            session.lock(ctx.name(f"t{threads}n{names}", i % names), TTL) for i in range(threads)
        ]
        count = ctx.sizes.thread_pairs
        barrier = threading.Barrier(threads)
        starts = [0] * threads
        ends = [0] * threads
        latencies: list[list[int]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                _pairs(locks[i], ctx.sizes.warmup, None)
                barrier.wait(timeout=120)
                starts[i] = time.perf_counter_ns()
                _pairs(locks[i], count, latencies[i])
                ends[i] = time.perf_counter_ns()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread
                errors.append(exc)
                barrier.abort()

        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        with gc_paused():
            for thread in pool:
                thread.start()
            for thread in pool:
                thread.join(timeout=600)
        if errors:
            raise errors[0]
        if any(thread.is_alive() for thread in pool):
            raise RuntimeError("a benchmark thread did not finish within 600 s")
        merged = [value for per_thread in latencies for value in per_thread]
        return Measurement(
            threads * count,
            max(ends) - min(starts),
            merged,
            {"threads": threads, "names": names},
        )

    return run


register(
    Scenario(
        key="uncontended",
        title="uncontended (1 thread, 1 name)",
        needs="lock",
        unit="pair",
        run=uncontended,
        single_connection=True,
    )
)

register(
    Scenario(
        key="threads8",
        title="8 threads on 8 names",
        needs="lock",
        unit="pair",
        run=threads_on_names(8, 8),
    )
)
