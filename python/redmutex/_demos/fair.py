"""Demo scenario: a fair lock hands over in the order the waiters arrived, across processes.

This process holds a `Lock(..., fair=True)`. Several worker processes (spawned, each with its own
interpreter and `Client`) then start waiting on it one after another, in a shuffled order; each
is let go only once the previous one has taken its place in the queue, so the arrival order is
known. On release the lock passes from waiter to waiter; the fencing token of each grant (which
strictly increases) gives the grant order, which must equal the arrival order.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import signal
import statistics
import sys
import time
import uuid
from typing import Any, TextIO

from redmutex._core import Client, Lock, _redact_text
from redmutex._demos.connect import redis_py_client

WAITERS = 4
HOLD_SECONDS = 0.05  # each waiter keeps the lock this long once it has it
QUEUED_WAIT = 2.0  # at most this long for a waiter's place in the queue to show up
START_TIMEOUT = 60.0
RUN_TIMEOUT = 60.0


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _waiter(url: str, prefix: str, name: str, label: str, go: Any, results: Any) -> None:
    """One process: connect, say ready, wait for its turn to arrive, then queue for the lock."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    client = Client(url, prefix=prefix)
    try:
        client.ping()
        lock = Lock(client, name, ttl=10, timeout=30, fair=True)
        results.put(("ready", label))
        if not go.wait(START_TIMEOUT):
            results.put(("error", label, "no start signal"))
            return
        if not lock.acquire():
            results.put(("error", label, "acquire() timed out"))
            return
        granted = time.perf_counter_ns()
        fence = lock.fence
        time.sleep(HOLD_SECONDS)
        lock.release()
        released = time.perf_counter_ns()
        results.put(("granted", label, fence, granted, released))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        results.put(("error", label, _redact_text(_one_line(exc), [url])))
    finally:
        client.close()


def _collect(results: Any, kind: str, count: int, timeout: float) -> list[tuple[Any, ...]]:
    """`count` messages of `kind`; raises RuntimeError on an error message or a timeout."""
    deadline = time.monotonic() + timeout
    got: list[tuple[Any, ...]] = []
    while len(got) < count:
        try:
            message = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"only {len(got)} of {count} waiters reported in time") from None
        if message[0] == "error":
            raise RuntimeError(f"waiter {message[1]}: {message[2]}")
        if message[0] == kind:
            got.append(message)
    return got


def _queued(conn: Any, key: str, count: int) -> None:
    """Returns once the fair queue holds `count` waiters (or after QUEUED_WAIT as a fallback)."""
    deadline = time.monotonic() + QUEUED_WAIT
    while time.monotonic() < deadline:
        if int(conn.hlen(key)) >= count:
            return
        time.sleep(0.005)


def fair_demo(url: str, waiters: int = WAITERS, out: TextIO = sys.stdout) -> int:
    """Runs the scenario against the Redis at `url`, prints a short report; 0 when all went well."""
    import redis

    prefix = f"redmutex-demo-{uuid.uuid4().hex[:8]}:"
    name = "fair-handoff"
    labels = [f"P{i + 1}" for i in range(waiters)]
    arrival = random.sample(range(waiters), waiters)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    gos = [ctx.Event() for _ in range(waiters)]
    workers = [
        ctx.Process(
            target=_waiter,
            args=(url, prefix, name, labels[i], gos[i], results),
            name=f"redmutex-demo-fair-{i}",
            daemon=True,
        )
        for i in range(waiters)
    ]
    print(
        f"fair hand-off: {waiters} processes queue on one Lock(fair=True) held by this process",
        file=out,
    )
    client = Client(url, prefix=prefix)
    conn = redis_py_client(redis.Redis, url, socket_timeout=10)
    holder = Lock(client, name, ttl=10, timeout=10, fair=True)
    problem = ""
    granted: list[tuple[Any, ...]] = []
    released_at = 0
    started = []  # an exception while starting them (Ctrl-C, a reader gone) joins these only
    try:
        for worker in workers:
            worker.start()
            started.append(worker)
        _collect(results, "ready", waiters, START_TIMEOUT)
        if not holder.acquire():
            raise RuntimeError("the holder could not take the lock")
        queue_key = f"{prefix}{{{name}}}:lock:queue"
        for position, index in enumerate(arrival, start=1):
            gos[index].set()
            _queued(conn, queue_key, position)
        holder.release()
        released_at = time.perf_counter_ns()
        granted = _collect(results, "granted", waiters, RUN_TIMEOUT)
    except RuntimeError as exc:
        problem = str(exc)
    finally:
        for go in gos:
            go.set()  # nobody is left waiting for a start signal
        for worker in started:  # only the processes started here, each by its own handle
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        results.close()
        try:
            keys = list(conn.scan_iter(match=prefix + "*"))
            if keys:
                conn.delete(*keys)
        except redis.RedisError:
            pass
        conn.close()
        client.close()

    arrived = [labels[i] for i in arrival]
    print(f"  arrival order:  {' '.join(arrived)}", file=out)
    if problem:
        print(f"  FAILED: {problem}", file=out)
        return 1
    by_fence = sorted(granted, key=lambda g: g[2])
    order = [g[1] for g in by_fence]
    fences = [g[2] for g in by_fence]
    by_time = [g[1] for g in sorted(granted, key=lambda g: g[3])]
    # hand-off: previous holder's release() -> next holder's acquire() returned
    previous = [released_at] + [g[4] for g in by_fence[:-1]]
    handoffs_ms = [(g[3] - p) / 1e6 for g, p in zip(by_fence, previous)]
    print(
        f"  grant order:    {' '.join(order)}   (fences {fences[0]}..{fences[-1]},"
        f" hand-off median {statistics.median(handoffs_ms):.2f} ms)",
        file=out,
    )
    ok = order == arrived and by_time == order
    if ok:
        print("  result:         ok: granted in arrival order", file=out)
    else:
        print("  result:         FAILED: the grants did not follow the arrival order", file=out)
    return 0 if ok else 1
