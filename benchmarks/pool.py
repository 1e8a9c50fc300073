"""Worker processes for the multi-process scenarios, started once per run and reused.

Starting eight interpreters for every scenario x peer would cost more than the measurements, so
the run keeps a pool of `size` spawned workers. A job runs on the first `processes` of them:

1. the parent sends the `Job`; each worker opens (once, then reuses) a session of the peer, makes
   one handle per contender thread, warms up on the job's name and answers "ready";
2. the parent reads whatever it wants to read before the window (INFO commandstats), then sends
   one start and end time on the shared monotonic clock; every thread sleeps until the start,
   contends until the end, and the worker answers with the sections it recorded;
3. the workers then sit idle on their pipe, so what the parent reads after the window is the
   job's alone.

Each worker is a `multiprocessing` process of this pool, ended by its own handle: `close()` asks
and joins, `kill()` kills. A job that does not finish within its bound breaks the pool (killed,
restarted for the next job) instead of hanging the run.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import contention
from peers import PEERS, WAIT, LockHandle

RING_POLL_S = 0.0002  # how often a releaser in a ring looks whether the next holder took over
SETUP_TIMEOUT_S = 90.0  # open a session, warm up
DRAIN_TIMEOUT_S = 2 * WAIT + 30  # after the window: waiters still queued finish their turn


@dataclass(frozen=True)
class Job:
    """What every participating worker runs, `threads` contenders each, on one name."""

    peer: str
    primitive: str  # "lock", "semaphore" or "read" (an RWLock's read side)
    name: str
    threads: int
    seconds: float  # the timed window
    warmup_s: float
    ttl: float
    # ring=True: after its release a contender waits until another one has taken over before it
    # asks again, so every section is a hand-off to a contender that was already waiting.
    # ring=False: it asks again at once (free-for-all; barging shows).
    ring: bool = False
    hold_s: float = 0.0  # how long each section holds the lock
    limit: int = 4  # semaphore only
    fair: bool = True  # semaphore only (locks take fairness from the peer)


@dataclass
class JobResult:
    start_ns: int
    end_ns: int
    sections: list[contention.Section]
    errors: list[str]
    # The workers' CPU time (every thread of each, user + sys) from "go" until their sections
    # were sent: the window and the drain after it, as the server's CPU is read.
    client_cpu_s: float = 0.0


class PoolBroken(RuntimeError):
    """A worker died or a job overran its bound; the pool was killed and will be restarted."""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _handle(session: Any, job: Job) -> LockHandle:
    if job.primitive == "lock":
        return session.lock(job.name, job.ttl, wait=WAIT)
    if job.primitive == "semaphore":
        return session.semaphore(job.name, job.limit, job.ttl, fair=job.fair, wait=WAIT)
    if job.primitive == "read":
        return session.rwlock_read(job.name, job.ttl, wait=WAIT)
    raise ValueError(f"unknown primitive {job.primitive!r}")


def _sleep_until(deadline_ns: int) -> None:
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


def _warm_up(handles: list[LockHandle], seconds: float) -> None:
    """Every thread takes and gives back the job's lock until `seconds` have passed.

    Connections, scripts and (where the peer has one) the wake-up subscription are set up here,
    outside the window; no thread asks again after the deadline, so waiters drain quickly.
    """
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    errors: list[BaseException] = []

    def loop(handle: LockHandle) -> None:
        try:
            while True:
                if not handle.acquire():
                    raise TimeoutError(f"warm-up acquire() gave up after {WAIT:g} s")
                handle.release()
                if time.perf_counter_ns() >= deadline:
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(h,), daemon=True) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 2 * WAIT + 10)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError("warm-up did not finish")


def _contend(
    handle: LockHandle,
    job: Job,
    owner: int,
    counter: Any,
    start_ns: int,
    end_ns: int,
    out: list[int],
    errors: list[str],
) -> None:
    """One contender: sections until the window ends; appends contention.FIELDS ints each."""
    clock, hold, ring = time.perf_counter_ns, job.hold_s, job.ring
    held = False
    try:
        _sleep_until(start_ns)
        while True:
            t0 = clock()
            if not handle.acquire():
                raise TimeoutError(f"acquire() gave up after {WAIT:g} s")
            t1 = clock()
            held = True
            seq = 0
            if ring:  # only the holder writes: the lock itself serialises this
                seq = counter.value + 1
                counter.value = seq
            if hold:
                time.sleep(hold)
            t2 = clock()
            held = False
            handle.release()
            t3 = clock()
            out.extend((owner, t0, t1, t2, t3))
            if t3 >= end_ns:
                return
            if ring:
                while counter.value == seq and clock() < end_ns:
                    time.sleep(RING_POLL_S)
                if clock() >= end_ns:
                    return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        errors.append(_one_line(exc))
        if held:
            try:
                handle.release()
            except Exception:  # noqa: BLE001, S110 - best effort; the lease ends anyway
                pass


def _run_job(
    handles: list[LockHandle], job: Job, index: int, counter: Any, start_ns: int, end_ns: int
) -> tuple[bytes, list[str]]:
    rows: list[list[int]] = [[] for _ in handles]
    errors: list[str] = []
    threads = [
        threading.Thread(
            target=_contend,
            args=(h, job, index * 1000 + i, counter, start_ns, end_ns, rows[i], errors),
            daemon=True,
        )
        for i, h in enumerate(handles)
    ]
    gc.collect()
    gc.disable()
    try:
        for thread in threads:
            thread.start()
        bound = (end_ns - time.perf_counter_ns()) / 1e9 + DRAIN_TIMEOUT_S - 5
        for thread in threads:
            thread.join(timeout=max(1.0, bound))
    finally:
        gc.enable()
    if any(t.is_alive() for t in threads):
        errors.append("a contender thread did not finish")
    return contention.encode([v for r in rows for v in r]), errors


def _worker_main(index: int, url: str, conn: Connection, counter: Any) -> None:
    """A pool worker: runs jobs from `conn` until "stop" or until the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sessions: dict[str, Any] = {}
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                return
            if message[0] != "job":
                continue
            job: Job = message[1]
            try:
                if job.peer not in sessions:
                    sessions[job.peer] = PEERS[job.peer].open(url)
                handles = [_handle(sessions[job.peer], job) for _ in range(job.threads)]
                _warm_up(handles, job.warmup_s)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                conn.send(("error", _one_line(exc)))
                continue
            conn.send(("ready",))
            message = conn.recv()
            if message[0] != "go":
                continue  # aborted: another worker could not get ready
            cpu0 = time.process_time()
            payload, errors = _run_job(handles, job, index, counter, message[1], message[2])
            conn.send(("done", payload, errors, time.process_time() - cpu0))
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent is gone
    finally:
        for session in sessions.values():
            try:
                session.close()
            except Exception:  # noqa: BLE001, S110 - closing is best effort
                pass


class WorkerPool:
    def __init__(self, url: str, size: int, log: Callable[[str], None]) -> None:
        self.url = url
        self.size = size
        self._log = log
        self._ctx = multiprocessing.get_context("spawn")
        self._counter: Any = None  # a shared ctypes c_longlong (RawValue)
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []

    def _start(self) -> None:
        counter = self._ctx.Value("q", 0, lock=False)
        self._counter = counter
        for index in range(self.size):
            parent_end, child_end = self._ctx.Pipe()
            process = self._ctx.Process(
                target=_worker_main,
                args=(index, self.url, child_end, counter),
                name=f"redmutex-bench-worker-{index}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self._workers.append((process, parent_end))
        self._log(f"  (started {self.size} worker processes; they import while the job is sent)")

    def _receive(self, conn: Connection, deadline: float, what: str) -> tuple[Any, ...]:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            self.kill()
            raise PoolBroken(f"a worker did not {what} in time; workers restarted")
        try:
            reply: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise PoolBroken(f"a worker died while it should {what}; workers restarted") from None
        return reply

    def run(
        self,
        job: Job,
        processes: int,
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
    ) -> JobResult:
        """Runs `job` on `processes` workers; `before`/`after` are called around the window."""
        if processes > self.size:
            raise ValueError(f"the pool has {self.size} workers, not {processes}")
        if not self._workers:
            self._start()
        assert self._counter is not None
        self._counter.value = 0
        workers = self._workers[:processes]
        for _, conn in workers:
            conn.send(("job", job))
        deadline = time.monotonic() + SETUP_TIMEOUT_S + job.warmup_s
        replies = [self._receive(conn, deadline, "get ready") for _, conn in workers]
        failed = [r[1] for r in replies if r[0] != "ready"]
        if failed:
            for (_, conn), reply in zip(workers, replies):
                if reply[0] == "ready":
                    conn.send(("abort",))
            raise RuntimeError(f"a worker could not get ready: {failed[0]}")
        if before is not None:
            try:
                before()
            except BaseException:
                for _, conn in workers:
                    conn.send(("abort",))
                raise
        start_ns = time.perf_counter_ns() + 100_000_000  # time for "go" to reach every worker
        end_ns = start_ns + int(job.seconds * 1e9)
        for _, conn in workers:
            conn.send(("go", start_ns, end_ns))
        deadline = time.monotonic() + 0.1 + job.seconds + DRAIN_TIMEOUT_S
        done = [self._receive(conn, deadline, "finish its job") for _, conn in workers]
        if after is not None:
            after()
        errors = [e for reply in done for e in reply[2]]
        cpu_s = sum(r[3] for r in done)
        return JobResult(start_ns, end_ns, contention.decode(r[1] for r in done), errors, cpu_s)

    def close(self) -> None:
        """Asks every worker to stop and joins it; kills whichever does not stop in time."""
        for _, conn in self._workers:
            try:
                conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        for process, conn in self._workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
            conn.close()
        self._workers = []

    def kill(self) -> None:
        """Kills every worker of this pool by its own handle and reaps it."""
        for process, conn in self._workers:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
            conn.close()
        self._workers = []
