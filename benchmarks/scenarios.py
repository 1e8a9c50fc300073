"""The scenarios: what is timed, written once against the peer interface.

A scenario is a function `(session, context) -> Measurement` plus the capability it needs and
the kind of result it gives (which decides the table it lands in):

- "pairs": acquire+release pairs/s in this process, per-pair latency;
- "handoff": hand-off latency between processes (the `latencies_ns` are hand-offs);
- "contended": critical sections/s of processes competing for one name, owner switches, waits;
- "commands": Redis commands (INFO commandstats) per hand-off, at one point of an axis.

In-process scenarios warm up before they start the clock, time with `time.perf_counter_ns`, and
keep the cyclic GC out of the timed region; multi-process ones run on the worker pool (pool.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import contention
from peers import LockHandle, Session
from pool import Job, JobResult, WorkerPool
from timing import Measurement, gc_paused

TTL = 10.0  # seconds: every lock in the lock scenarios is taken with this lease
HOLD_S = 0.001  # hand-off scenarios: each holder keeps the lock this long, so others queue up
SEMAPHORE_LIMIT = 4


@dataclass(frozen=True)
class Sizes:
    pairs: int  # timed acquire+release pairs, single-thread scenarios
    warmup: int  # untimed pairs before each timed run (per thread)
    thread_pairs: int  # timed pairs per thread, threaded scenarios
    rounds: int  # each in-process scenario x peer is run this many times, peers interleaved
    benchmark_requests: int  # requests per redis-benchmark run (physical limit)
    max_seconds: float  # an in-process timed run stops after this long, pairs done or not
    process_rounds: int  # rounds of the multi-process scenarios
    cpu_rounds: int  # rounds of the hand-off and contended ones (server CPU compared by round)
    process_seconds: float  # timed window of one multi-process run
    command_seconds: float  # timed window of one commands-per-hand-off run (one round)
    warmup_seconds: float  # warm-up of the workers before a multi-process run
    command_rounds: int = 1  # rounds of the commands-per-hand-off points (counts, not speeds)
    interleave_cycles: int = 8  # uncontended vs the blocking-socket limit in turns (interleaved.py)
    interleave_window_s: float = 0.15  # one window of those turns


QUICK = Sizes(
    pairs=5_000,
    warmup=500,
    thread_pairs=1_000,
    rounds=2,
    benchmark_requests=20_000,
    max_seconds=0.5,
    process_rounds=1,
    cpu_rounds=2,
    process_seconds=0.8,
    command_seconds=0.5,
    warmup_seconds=0.1,
    interleave_cycles=6,
    interleave_window_s=0.1,
)
DEFAULT = Sizes(
    pairs=20_000,
    warmup=2_000,
    thread_pairs=3_000,
    rounds=4,
    benchmark_requests=100_000,
    max_seconds=1.5,
    process_rounds=2,
    cpu_rounds=4,
    process_seconds=2.0,
    command_seconds=1.2,
    warmup_seconds=0.3,
)


@dataclass(frozen=True)
class Context:
    namespace: str  # every key name a scenario uses starts with this (unique per run)
    sizes: Sizes
    peer: str
    pool: WorkerPool | None = None  # the worker processes (multi-process scenarios)
    commandstats: Callable[[], dict[str, int]] | None = None  # calls per command, INFO excluded
    server_cpu: Callable[[], float] | None = None  # the server's CPU time so far, µs (INFO cpu)

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
    kind: str = "pairs"  # "pairs", "handoff", "contended" or "commands" (see the module doc)
    rounds: str = "rounds"  # the Sizes field that gives its number of rounds
    processes: int = 0  # worker processes it needs (0: it runs in the benchmark process)
    axis: str = ""  # "commands": "threads" or "processes"
    point: int = 0  # "commands": the value on that axis
    capacity: int | None = 1  # holders allowed at once (None: any number, e.g. readers)
    quick: bool = True  # part of a --quick run's default selection
    reference: str = ""  # a capability of reference peers that run it too (beside `needs`)


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    SCENARIOS[scenario.key] = scenario
    return scenario


# --- in-process scenarios ------------------------------------------------------------------


def _pairs(lock: LockHandle, count: int, latencies: list[int] | None, deadline_ns: int) -> int:
    """Up to `count` acquire+release pairs, fewer if `deadline_ns` passes; returns how many.

    With `latencies`, appends each pair's duration in ns.
    """
    acquire, release, clock = lock.acquire, lock.release, time.perf_counter_ns
    done = 0
    if latencies is None:
        for done in range(1, count + 1):
            if not acquire():
                raise RuntimeError("an uncontended acquire() returned False")
            release()
            if done % 64 == 0 and clock() >= deadline_ns:
                break
        return done
    append = latencies.append
    for done in range(1, count + 1):
        start = clock()
        if not acquire():
            raise RuntimeError("an uncontended acquire() returned False")
        release()
        end = clock()
        append(end - start)
        if end >= deadline_ns:
            break
    return done


def _deadline(seconds: float) -> int:
    return time.perf_counter_ns() + int(seconds * 1e9)


def _single_thread(make: Callable[[Session, Context], LockHandle]) -> Callable[..., Measurement]:
    """One thread, one name, one reused object: N acquire+release pairs back to back."""

    def run(session: Session, ctx: Context) -> Measurement:
        return _timed_pairs(make(session, ctx), ctx, ctx.sizes.max_seconds)

    return run


def _timed_pairs(lock: LockHandle, ctx: Context, seconds: float) -> Measurement:
    """Warm-up, then up to `ctx.sizes.pairs` timed pairs, at most `seconds` long."""
    _pairs(lock, ctx.sizes.warmup, None, _deadline(seconds / 4))
    latencies: list[int] = []
    with gc_paused():
        start = time.perf_counter_ns()
        done = _pairs(lock, ctx.sizes.pairs, latencies, start + int(seconds * 1e9))
        elapsed = time.perf_counter_ns() - start
    return Measurement(done, elapsed, latencies)


def _single_thread_beside_lock(
    make: Callable[[Session, Context], LockHandle],
) -> Callable[..., Measurement]:
    """As `_single_thread`, framed by the same session's Lock: a Lock run of half the length just
    before and just after, on a name of its own. `vs_lock` is this run's pairs/s over those two
    Lock runs' together: the ratio within seconds, which the machine's speed changing between
    scenarios minutes apart (up to 2x on this kind of VM) cannot move."""

    def run(session: Session, ctx: Context) -> Measurement:
        lock = session.lock(ctx.name("beside-lock"), TTL)
        subject = make(session, ctx)
        half = ctx.sizes.max_seconds / 2
        before = _timed_pairs(lock, ctx, half)
        measured = _timed_pairs(subject, ctx, ctx.sizes.max_seconds)
        after = _timed_pairs(lock, ctx, half)
        # Rounded first: the ratio is then the one a reader gets from the figures shown.
        lock_rate = round(
            Measurement(
                before.operations + after.operations, before.elapsed_ns + after.elapsed_ns
            ).per_second,
            1,
        )
        measured.extra.update(
            lock_per_second=lock_rate,
            vs_lock=round(measured.per_second / lock_rate, 3) if lock_rate else None,
        )
        return measured

    return run


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
        done = [0] * threads
        latencies: list[list[int]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                _pairs(locks[i], ctx.sizes.warmup, None, _deadline(ctx.sizes.max_seconds / 4))
                barrier.wait(timeout=120)
                starts[i] = time.perf_counter_ns()
                deadline = starts[i] + int(ctx.sizes.max_seconds * 1e9)
                done[i] = _pairs(locks[i], count, latencies[i], deadline)
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
            sum(done), max(ends) - min(starts), merged, {"threads": threads, "names": names}
        )

    return run


# --- multi-process scenarios ---------------------------------------------------------------


def _run_job(ctx: Context, job: Job, processes: int, **hooks: Any) -> JobResult:
    if ctx.pool is None:
        raise RuntimeError("this scenario needs the worker pool")
    result = ctx.pool.run(job, processes, **hooks)
    if result.errors:
        raise RuntimeError(f"{len(result.errors)} contender(s) failed: {result.errors[0]}")
    return result


def _server_work(ctx: Context) -> tuple[dict[str, Any], dict[str, Callable[[], None]]]:
    """Hooks that read the server's CPU time and command counts before and after a job's
    window, and where they put them (see `_per_section`)."""
    seen: dict[str, Any] = {}
    if ctx.server_cpu is None or ctx.commandstats is None:
        return seen, {}
    cpu, calls = ctx.server_cpu, ctx.commandstats

    def read(when: str) -> None:
        seen[when] = (cpu(), sum(calls().values()))

    return seen, {"before": lambda: read("before"), "after": lambda: read("after")}


def _per_section(seen: dict[str, Any], result: JobResult) -> dict[str, Any]:
    """Server CPU µs (user + sys), commands (a script's inner calls included) and the clients'
    CPU µs (all their processes and threads) per critical section, over everything the job's
    workers did between the two reads: the window and the drain after it, whose sections are
    all counted."""
    sections = len(result.sections)
    if sections < 1:
        return {}
    client = {"client_cpu_us_per_section": result.client_cpu_s * 1e6 / sections}
    if "before" not in seen or "after" not in seen:
        return client
    (cpu0, calls0), (cpu1, calls1) = seen["before"], seen["after"]
    return {
        "server_cpu_us_per_section": (cpu1 - cpu0) / sections,
        "commands_per_section": (calls1 - calls0) / sections,
        **client,
    }


def _check_exclusion(summary: dict[str, Any]) -> None:
    if summary["exclusion_violated"]:
        raise RuntimeError(
            f"exclusion violated: {summary['max_holders_max']} holders at once"
            f" (at most {summary['capacity']} allowed)"
        )


def handoff(processes: int) -> Callable[[Session, Context], Measurement]:
    """`processes` processes pass one lock around: each holds it HOLD_S, then releases and
    asks again only once another has taken over, so each release finds the others waiting.
    What is timed is release() returning in one process -> acquire() returning in the next."""

    def run(session: Session, ctx: Context) -> Measurement:
        job = Job(
            peer=ctx.peer,
            primitive="lock",
            name=ctx.name(f"handoff{processes}"),
            threads=1,
            seconds=ctx.sizes.process_seconds,
            warmup_s=ctx.sizes.warmup_seconds,
            ttl=TTL,
            ring=True,
            hold_s=HOLD_S,
        )
        seen, hooks = _server_work(ctx)
        result = _run_job(ctx, job, processes, **hooks)
        summary = contention.contended_summary(result.sections, result.start_ns, result.end_ns, 1)
        _check_exclusion(summary)
        latencies = contention.handoff_latencies(result.sections, result.start_ns, result.end_ns)
        if not latencies:
            raise RuntimeError("no hand-off happened in the window")
        return Measurement(
            len(latencies),
            result.end_ns - result.start_ns,
            latencies,
            {
                "processes": processes,
                "handoffs": len(latencies),
                **_per_section(seen, result),
            },
        )

    return run


def contended(
    processes: int, primitive: str = "lock", *, capacity: int | None = 1, fair: bool = True
) -> Callable[[Session, Context], Measurement]:
    """`processes` processes loop acquire -> (empty section) -> release on one name, asking
    again at once: total sections/s, owner switches, the longest wait of any acquire()."""

    def run(session: Session, ctx: Context) -> Measurement:
        job = Job(
            peer=ctx.peer,
            primitive=primitive,
            name=ctx.name(f"contended-{primitive}{processes}{'' if fair else 'u'}"),
            threads=1,
            seconds=ctx.sizes.process_seconds,
            warmup_s=ctx.sizes.warmup_seconds,
            ttl=TTL,
            limit=capacity or 1,
            fair=fair,
        )
        seen, hooks = _server_work(ctx)
        result = _run_job(ctx, job, processes, **hooks)
        summary = contention.contended_summary(
            result.sections, result.start_ns, result.end_ns, capacity
        )
        _check_exclusion(summary)
        waits = summary.pop("wait_ns")
        extra = {
            k: v for k, v in summary.items() if k not in ("sections", "per_second", "capacity")
        }
        return Measurement(
            summary["sections"],
            result.end_ns - result.start_ns,
            waits,
            {"processes": processes, **extra, **_per_section(seen, result)},
        )

    return run


def commands_per_handoff(processes: int, threads: int) -> Callable[[Session, Context], Measurement]:
    """Hand-offs as in `handoff`, among `threads` threads in each of `processes` processes;
    the Redis commands executed meanwhile (INFO commandstats deltas, which count the commands
    a script runs as well as the script call itself) divided by the number of hand-offs."""

    def run(session: Session, ctx: Context) -> Measurement:
        if ctx.commandstats is None:
            raise RuntimeError("this scenario needs INFO commandstats")
        read = ctx.commandstats
        stats: dict[str, dict[str, int]] = {}
        job = Job(
            peer=ctx.peer,
            primitive="lock",
            name=ctx.name(f"commands-p{processes}t{threads}"),
            threads=threads,
            seconds=ctx.sizes.command_seconds,
            warmup_s=ctx.sizes.warmup_seconds,
            ttl=TTL,
            ring=True,
            hold_s=HOLD_S,
        )
        result = _run_job(
            ctx,
            job,
            processes,
            before=lambda: stats.__setitem__("before", read()),
            after=lambda: stats.__setitem__("after", read()),
        )
        summary = contention.contended_summary(result.sections, result.start_ns, result.end_ns, 1)
        _check_exclusion(summary)
        handoffs = contention.owner_switches(result.sections)
        if handoffs < 1:
            raise RuntimeError("no hand-off happened in the window")
        before, after = stats["before"], stats["after"]
        delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        total = sum(delta.values())
        return Measurement(
            handoffs,
            result.end_ns - result.start_ns,
            [],
            {
                "processes": processes,
                "threads_per_process": threads,
                "waiting": processes * threads - 1,
                "handoffs": handoffs,
                "commands": total,
                "commands_per_handoff": total / handoffs,
                "per_command": {
                    k: round(n / handoffs, 3)
                    for k, n in sorted(delta.items(), key=lambda kv: -kv[1])
                },
            },
        )

    return run


# --- the registry --------------------------------------------------------------------------

register(
    Scenario(
        key="uncontended",
        title="uncontended (1 thread, 1 name)",
        needs="lock",
        unit="pair",
        run=_single_thread(lambda s, ctx: s.lock(ctx.name("uncontended"), TTL)),
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

for _p in (2, 4):
    register(
        Scenario(
            key=f"handoff{_p}",
            title=f"hand-off, {_p} processes",
            needs="lock",
            unit="hand-off",
            run=handoff(_p),
            kind="handoff",
            reference="raw-handoff",
            rounds="cpu_rounds",
            processes=_p,
        )
    )

for _p in (4, 8):
    register(
        Scenario(
            key=f"contended{_p}",
            title=f"contended, {_p} processes on 1 name",
            needs="lock",
            unit="section",
            run=contended(_p),
            kind="contended",
            rounds="cpu_rounds",
            processes=_p,
        )
    )

for _w in (1, 4, 16, 64):
    register(
        Scenario(
            key=f"commands-w{_w}",
            title=f"commands per hand-off, 1 process, {_w} waiting thread(s)",
            needs="lock",
            unit="hand-off",
            run=commands_per_handoff(1, _w + 1),
            kind="commands",
            rounds="command_rounds",
            processes=1,
            axis="threads",
            point=_w,
            quick=_w in (1, 64),
        )
    )

for _p in (1, 2, 4, 8):
    register(
        Scenario(
            key=f"commands-p{_p}",
            title=f"commands per hand-off, {_p} process(es) x 2 threads",
            needs="lock",
            unit="hand-off",
            run=commands_per_handoff(_p, 2),
            kind="commands",
            rounds="command_rounds",
            processes=_p,
            axis="processes",
            point=_p,
            quick=_p in (1, 8),
        )
    )

register(
    Scenario(
        key="semaphore",
        title=f"Semaphore uncontended (limit {SEMAPHORE_LIMIT})",
        needs="semaphore",
        unit="pair",
        run=_single_thread(
            lambda s, ctx: s.semaphore(ctx.name("semaphore"), SEMAPHORE_LIMIT, TTL)  # type: ignore[attr-defined]
        ),
        single_connection=True,
    )
)

for _fair in (True, False):
    register(
        Scenario(
            key=f"semaphore8-{'fair' if _fair else 'unfair'}",
            title=(
                f"Semaphore, 8 processes on limit {SEMAPHORE_LIMIT}, {'fair' if _fair else 'unfair'}"
            ),
            needs="semaphore",
            unit="section",
            run=contended(8, "semaphore", capacity=SEMAPHORE_LIMIT, fair=_fair),
            kind="contended",
            rounds="process_rounds",
            processes=8,
            capacity=SEMAPHORE_LIMIT,
        )
    )

register(
    Scenario(
        key="rwlock-read",
        title="RWLock read, uncontended",
        needs="rwlock",
        unit="pair",
        run=_single_thread_beside_lock(
            lambda s, ctx: s.rwlock_read(ctx.name("rwlock-read"), TTL)  # type: ignore[attr-defined]
        ),
        single_connection=True,
    )
)

register(
    Scenario(
        key="rwlock-write",
        title="RWLock write, uncontended",
        needs="rwlock",
        unit="pair",
        run=_single_thread_beside_lock(
            lambda s, ctx: s.rwlock_write(ctx.name("rwlock-write"), TTL)  # type: ignore[attr-defined]
        ),
        single_connection=True,
    )
)

register(
    Scenario(
        key="rwlock-read8",
        title="RWLock readers, 8 processes",
        needs="rwlock",
        unit="section",
        run=contended(8, "read", capacity=None),
        kind="contended",
        rounds="process_rounds",
        processes=8,
        capacity=None,
    )
)
